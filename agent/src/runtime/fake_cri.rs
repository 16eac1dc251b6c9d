//! A CRI gRPC server backed by any [`Runtime`](super::Runtime), for tests of the CRI client.
