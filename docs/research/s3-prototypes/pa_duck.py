import sys, time, os
import pyarrow as pa, pyarrow.fs as pafs, pyarrow.dataset as ds, pyarrow.parquet as pq
import duckdb
from deltalake import DeltaTable
ep = sys.argv[1]
host = ep.split("://")[1]
t = time.time()
s3 = pafs.S3FileSystem(access_key="testkey", secret_key="testsecret", region="us-east-1",
                       endpoint_override=host, scheme="http", force_virtual_addressing=False)
print("pyarrow", pa.__version__, "S3FileSystem init", round(time.time() - t, 3), "s")
# write a parquet with small row groups
tbl = pa.table({"key": [f"k{i:05d}" for i in range(20000)], "v": list(range(20000))})
pq.write_table(tbl, "test/pa/data.parquet", filesystem=s3, row_group_size=1000)
print("info", s3.get_file_info("test/pa/data.parquet"))
print("list prefix", [f.path for f in s3.get_file_info(pafs.FileSelector("test/dl/cp", recursive=False))][:5])
# DuckDB over an Arrow dataset on S3 (filter+projection pushdown)
con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
dset = ds.dataset("test/pa/data.parquet", filesystem=s3, format="parquet")
con.register("d", dset)
t = time.time()
print(con.sql("select count(*), min(v), max(v) from d where key between 'k01000' and 'k01009'").fetchall(), round(time.time() - t, 3), "s")
# Delta table via deltalake -> files -> pyarrow dataset -> duckdb
opts = {"AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": "testkey", "AWS_SECRET_ACCESS_KEY": "testsecret", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
dt = DeltaTable("s3://test/dl/cp", storage_options=opts, version=1)
files = [u.removeprefix("s3://") for u in dt.file_uris()]
d2 = ds.dataset(files, filesystem=s3, format="parquet")
con.register("snap", d2)
print("delta v1 via pyarrow+duckdb:", con.sql("select count(*), sum(x) from snap").fetchall())
# deltalake's own arrow dataset (uses delta-rs object store, no pyarrow S3)
try:
    d3 = dt.to_pyarrow_dataset()
    con.register("snap3", d3); print("dt.to_pyarrow_dataset via duckdb:", con.sql("select count(*) from snap3").fetchall())
except Exception as e:
    print("to_pyarrow_dataset FAIL", str(e)[:200])
# env-only pyarrow config
os.environ.update({"AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": "testkey", "AWS_SECRET_ACCESS_KEY": "testsecret", "AWS_REGION": "us-east-1"})
try:
    fs2, p = pafs.FileSystem.from_uri("s3://test/pa/data.parquet")
    print("from_uri env-only endpoint:", type(fs2).__name__, fs2.get_file_info(p).size)
except Exception as e:
    print("from_uri env-only FAIL", str(e)[:300])
try:
    fs3 = pafs.S3FileSystem()
    print("S3FileSystem() env-only:", fs3.get_file_info("test/pa/data.parquet").size)
except Exception as e:
    print("S3FileSystem() env-only FAIL", str(e)[:300])
# duckdb read_parquet on s3:// without httpfs
try:
    con.sql("select count(*) from read_parquet('s3://test/pa/data.parquet')").fetchall()
except Exception as e:
    print("duckdb read_parquet s3:// FAIL:", str(e)[:200].replace("\n", " | "))
