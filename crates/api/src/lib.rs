//! Switchyard custom resources.
