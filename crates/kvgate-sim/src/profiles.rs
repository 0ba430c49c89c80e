//! Step-time profiles (to be implemented).
