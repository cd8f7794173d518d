//! Real processes SIGKILLed and restarted while they work.

pub(crate) mod processes;
