"""Studies defined only in the tests, registered as the package's own are (`studies.registry`)."""
