"""`stopping.behind`: which trials the fit only needs to know are slower."""
