//! What differs between the architectures bpfscope runs on (x86_64,
//! aarch64) outside the BPF programs: the ELF machine of native code and
//! the library directories Debian names after the architecture.

/// `e_machine` of this architecture's ELF files.
pub const ELF_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    183
} else {
    62
};

/// The loader's default library directories for this architecture.
pub const LIB_DIRS: [&str; 2] = if cfg!(target_arch = "aarch64") {
    ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
} else {
    ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
};
