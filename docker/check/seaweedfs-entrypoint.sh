#!/bin/sh
# weed mini (master, volume, filer and S3 in one process) with one identity: MinIO's root
# user and password, read from the files compose names (MINIO_ROOT_USER_FILE, _PASSWORD_FILE)
# as MinIO reads them, or given directly.
set -eu
MINIO_ROOT_USER="${MINIO_ROOT_USER:-$(cat "${MINIO_ROOT_USER_FILE:?}")}"
MINIO_ROOT_PASSWORD="${MINIO_ROOT_PASSWORD:-$(cat "${MINIO_ROOT_PASSWORD_FILE:?}")}"
mkdir -p /home/seaweedfs/data /home/seaweedfs/conf
cat > /home/seaweedfs/conf/s3.json <<JSON
{"identities": [{"name": "root", "credentials": [{"accessKey": "${MINIO_ROOT_USER}", "secretKey": "${MINIO_ROOT_PASSWORD}"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
exec weed -logtostderr mini -dir=/home/seaweedfs/data -ip=127.0.0.1 -ip.bind=0.0.0.0 -master.telemetry=false \
    -s3.port=9000 -s3.config=/home/seaweedfs/conf/s3.json -s3.autoCreateBucket=false -webdav=false -admin.ui=false
