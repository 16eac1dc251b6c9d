//! The HTTP apiserver (to be written).
