//! The storage test suite shared by both backends (to be written).
