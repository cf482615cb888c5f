"""What the Client-Server API promises: error codes and constants."""
