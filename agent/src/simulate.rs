//! `skiff-agent simulate --nodes N`: N nodes in one process with the real agent code over the in-memory runtime.
