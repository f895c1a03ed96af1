import sys, json, time
import boto3, botocore
from botocore.config import Config
ep = sys.argv[1]
s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id="testkey", aws_secret_access_key="testsecret", region_name="us-east-1", config=Config(retries={"max_attempts": 1}))
def code(f):
    try: r = f(); return r["ResponseMetadata"]["HTTPStatusCode"], r
    except botocore.exceptions.ClientError as e: return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]
K = "wh/store1/_versiq/lock"
s3.delete_object(Bucket="test", Key=K)
body = lambda owner, gen: json.dumps({"owner": owner, "generation": gen, "ttl_s": 30}).encode()
c, r = code(lambda: s3.put_object(Bucket="test", Key=K, Body=body("A", 1), IfNoneMatch="*")); print("A acquire (If-None-Match *):", c)
etagA = r["ETag"]; print("  Date header:", r["ResponseMetadata"]["HTTPHeaders"].get("date"))
c, r2 = code(lambda: s3.put_object(Bucket="test", Key=K, Body=body("B", 1), IfNoneMatch="*")); print("B acquire while held:", c, r2 if c != 200 else "")
h = s3.head_object(Bucket="test", Key=K); print("  head LastModified:", h["LastModified"], "ETag:", h["ETag"])
c, r = code(lambda: s3.put_object(Bucket="test", Key=K, Body=body("A", 2), IfMatch=etagA)); print("A renew (If-Match etagA):", c); etagA2 = r["ETag"] if c == 200 else None
c, r = code(lambda: s3.put_object(Bucket="test", Key=K, Body=body("B", 3), IfMatch=etagA)); print("B takeover with stale etag:", c, r if c != 200 else "")
c, r = code(lambda: s3.put_object(Bucket="test", Key=K, Body=body("B", 3), IfMatch=etagA2)); print("B takeover with current etag (after expiry):", c); etagB = r["ETag"] if c == 200 else None
c, r = code(lambda: s3.put_object(Bucket="test", Key=K, Body=body("A", 3), IfMatch=etagA2)); print("A late renew with its old etag:", c, r if c != 200 else "")
c, r = code(lambda: s3.delete_object(Bucket="test", Key=K, IfMatch=etagA2)); print("A release (DELETE If-Match old etag):", c, r if c not in (200, 204) else "")
print("  still there:", s3.get_object(Bucket="test", Key=K)["Body"].read())
c, r = code(lambda: s3.delete_object(Bucket="test", Key=K, IfMatch=etagB)); print("B release (DELETE If-Match current etag):", c)
c, r = code(lambda: s3.head_object(Bucket="test", Key=K)); print("  head after release:", c)
# same-content PUT => same etag (md5)? matters for renewals: include a counter/timestamp in body
s3.put_object(Bucket="test", Key="wh/x1", Body=b"same"); e1 = s3.head_object(Bucket="test", Key="wh/x1")["ETag"]
s3.put_object(Bucket="test", Key="wh/x1", Body=b"same"); e2 = s3.head_object(Bucket="test", Key="wh/x1")["ETag"]
print("etag of identical body rewrite equal:", e1 == e2, e1)
# multipart complete with If-None-Match
mp = s3.create_multipart_upload(Bucket="test", Key="wh/mp")
p = s3.upload_part(Bucket="test", Key="wh/mp", UploadId=mp["UploadId"], PartNumber=1, Body=b"a" * (5 << 20))
c, _ = code(lambda: s3.complete_multipart_upload(Bucket="test", Key="wh/mp", UploadId=mp["UploadId"], MultipartUpload={"Parts": [{"ETag": p["ETag"], "PartNumber": 1}]}, IfNoneMatch="*")); print("multipart complete If-None-Match (new):", c)
mp = s3.create_multipart_upload(Bucket="test", Key="wh/mp")
p = s3.upload_part(Bucket="test", Key="wh/mp", UploadId=mp["UploadId"], PartNumber=1, Body=b"b" * (5 << 20))
c, r = code(lambda: s3.complete_multipart_upload(Bucket="test", Key="wh/mp", UploadId=mp["UploadId"], MultipartUpload={"Parts": [{"ETag": p["ETag"], "PartNumber": 1}]}, IfNoneMatch="*")); print("multipart complete If-None-Match (existing):", c, r if c != 200 else "")
print("  content first byte:", s3.get_object(Bucket="test", Key="wh/mp", Range="bytes=0-0")["Body"].read())
# user metadata round trip (for a write-id to resolve ambiguous commits)
s3.put_object(Bucket="test", Key="wh/meta", Body=b"m", Metadata={"versiq-write-id": "abc-123"})
print("user metadata:", s3.head_object(Bucket="test", Key="wh/meta")["Metadata"])
# copy-if-not-exists style: CopyObject with If-None-Match header?
c, r = code(lambda: s3.copy_object(Bucket="test", Key="wh/meta", CopySource="test/wh/x1")); print("copy over existing (unconditional):", c)
