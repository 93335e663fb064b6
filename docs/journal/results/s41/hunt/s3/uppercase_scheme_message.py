"""'S3://bucket/key' (as AWS consoles and some configs spell it): fsspec does not know the
protocol 'S3', and ckptzip reports it as 'the filesystem refused its storage_options', pointing
the user at their options instead of the URL's spelling."""
import sys, torch
import ckptzip
try:
    ckptzip.save({"w": torch.zeros(3)}, "S3://bucket/a.ckz", storage_options={"key": "k", "secret": "s"})
except ckptzip.Error as e:
    print(type(e).__name__, e)
    sys.exit(1 if "storage_options" in str(e) else 0)
