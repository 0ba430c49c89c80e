//! Workloads: trace readers and generators (to be implemented).
