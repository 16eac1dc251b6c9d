//! The agent's authenticated endpoint: container logs and exec, proxied to by skiff-server.
