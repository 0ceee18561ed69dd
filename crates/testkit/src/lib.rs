//! switchyard-testkit
