"""What the tests stand on: databases, services and processes to test against."""
