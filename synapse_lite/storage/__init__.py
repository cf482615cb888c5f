"""Storage: the database pool and engines, the schema, ID generators and stores."""
