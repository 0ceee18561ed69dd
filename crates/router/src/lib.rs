//! switchyard-router
