# One image for both halves of versiq:
#   docker run -p 8080:8080 -v warehouse:/warehouse IMAGE                 # serve (default CMD)
#   docker run -v warehouse:/warehouse -v $PWD/data:/data:ro IMAGE \
#       ingest --warehouse /warehouse --store prices --source /data       # ingest (PySpark, local[*])
# The jars Spark loads beside PySpark's own, fetched and built at build time with Maven, as the
# Makefile's $(SPARK_JARS) does: Delta's connector and Spark's Kafka source (jars/pom.xml), S3A
# with the AWS SDK modules it uses (jars/s3/pom.xml), versiq's S3 LogStore and local file system
# (jars/logstore).
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY jars/pom.xml /build/pom.xml
COPY jars/s3/pom.xml /build/s3/pom.xml
COPY jars/logstore /build/jars/logstore
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DoutputDirectory=/jars -DexcludeTransitive=true \
 && mvn -q -B -f /build/s3/pom.xml dependency:copy-dependencies -DoutputDirectory=/jars -DincludeScope=runtime \
 && mvn -q -B -f /build/jars/logstore/pom.xml package -DskipTests \
 && cp /build/.cache/build/logstore/versiq-delta-logstore-1.jar /jars/

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A Debian JRE for Spark's JVM (procps: Spark's launch scripts call ps). Slim images drop
# /usr/share/man, which the JRE's post-install links into.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin versiq

WORKDIR /src
COPY pyproject.toml README.md ./
COPY versiq ./versiq
COPY ingest ./ingest
COPY query ./query
COPY service ./service
COPY cli ./cli
RUN pip install --no-cache-dir . && rm -rf /src/build

COPY --from=jars /jars /opt/versiq/jars

# The driver JVM's class-data-sharing archive (versiq/ingest/class_archive.py, best effort): every Spark start of the
# image maps the classes Spark loads instead of parsing them again (~2.5 s shorter).
ENV VERSIQ_JVM_ARCHIVE_DIR=/opt/versiq/jvm
RUN VERSIQ_SPARK_JARS=/opt/versiq/jars PYSPARK_PYTHON=python3 \
    python3 -c "from versiq.ingest.class_archive import write_class_archive; write_class_archive()"

RUN mkdir -p /warehouse /data /var/cache/versiq && chown versiq:versiq /warehouse /data /var/cache/versiq
USER versiq
WORKDIR /home/versiq

# `versiq serve` reads VERSIQ_*; Spark's Python workers use this image's python3.
ENV PYSPARK_PYTHON=python3 \
    VERSIQ_SPARK_JARS=/opt/versiq/jars \
    VERSIQ_WAREHOUSE=/warehouse \
    VERSIQ_CACHE_DIR=/var/cache/versiq \
    VERSIQ_HOST=0.0.0.0 \
    VERSIQ_PORT=8080

VOLUME /warehouse
EXPOSE 8080

# No curl in slim images: ask /readyz with Python (non-2xx raises, so the check fails).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('VERSIQ_PORT', '8080') + '/readyz', timeout=4)"]

ENTRYPOINT ["versiq"]
CMD ["serve", "--log-format", "json"]
