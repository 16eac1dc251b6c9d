//! skiff-cni: CNI plugin (veth, IPAM, routes)
