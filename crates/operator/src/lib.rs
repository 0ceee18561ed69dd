//! switchyard-operator
