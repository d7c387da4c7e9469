"""Where a sweep's files live: the sweep directory's layout, local or at a URI (s3://), and the checks that a
directory is writable and shared."""
