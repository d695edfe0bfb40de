"""Checkpoint storage per contract on Ceph RGW: a user, a bucket, a lifecycle rule."""
