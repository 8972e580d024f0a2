//! Timeline model (pure).
