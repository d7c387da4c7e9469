"""`make cluster-local`: a multi-node Ray, an MLflow server and a moto S3 on this machine, and the rehearsal on them."""
