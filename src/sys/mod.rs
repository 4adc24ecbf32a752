//! System facts and process-wide state every stage may need (signals,
//! output files that appear whole or not at all). A leaf: it imports
//! nothing else of bpfscope.

pub mod outfile;
pub mod signals;
