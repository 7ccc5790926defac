#!/bin/sh
# weed mini (master, volume, filer and S3 in one process) with one identity: MinIO's root
# user and password, so compose's learners and bucket-init use it unchanged.
set -eu
mkdir -p /home/seaweedfs/data /home/seaweedfs/conf
cat > /home/seaweedfs/conf/s3.json <<JSON
{"identities": [{"name": "root", "credentials": [{"accessKey": "${MINIO_ROOT_USER}", "secretKey": "${MINIO_ROOT_PASSWORD}"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
exec weed -logtostderr mini -dir=/home/seaweedfs/data -ip=127.0.0.1 -ip.bind=0.0.0.0 -master.telemetry=false \
    -s3.port=9000 -s3.config=/home/seaweedfs/conf/s3.json -s3.autoCreateBucket=false -webdav=false -admin.ui=false
