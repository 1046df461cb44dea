#!/usr/bin/env python3
"""Prepares a moto_server started with INITIAL_NO_AUTH_ACTION_COUNT=3 for the S3 tests.

Its first three requests go unauthenticated; they create an IAM user that may
do anything, and an access key for it. Every later request must be signed
with that key, so the tests check real SigV4 signatures. Then, signed, it
creates the buckets named on the command line. Prints "ACCESS_KEY_ID SECRET".

    python3 s3_server.py http://127.0.0.1:PORT BUCKET...
"""
import json
import sys

import boto3

ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def main():
    endpoint, buckets = sys.argv[1], sys.argv[2:]
    # Any credentials do for the three unauthenticated requests.
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam.create_user(UserName="distckpt-tests")
    iam.put_user_policy(UserName="distckpt-tests", PolicyName="allow-all", PolicyDocument=json.dumps(ALLOW_ALL))
    key = iam.create_access_key(UserName="distckpt-tests")["AccessKey"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    for bucket in buckets:
        s3.create_bucket(Bucket=bucket)
    print(key["AccessKeyId"], key["SecretAccessKey"])


if __name__ == "__main__":
    sys.exit(main())
