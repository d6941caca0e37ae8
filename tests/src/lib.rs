//! Shared harness for the integration tests: each test gets its own database, Redis key prefix and topic/group prefix.
