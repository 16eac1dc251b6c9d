//! Test images as OCI archives (built from busybox-static) and their import into containerd.
