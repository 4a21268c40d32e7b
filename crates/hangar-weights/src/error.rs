//! The error taxonomy of the weights checker.

use std::path::{Path, PathBuf};

/// Why weights could not be digested. Every message names the file (or directory) at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// A file or directory could not be opened, listed or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not a well-formed GGUF or safetensors file: bad magic, a truncated header,
    /// an unsupported GGUF version, an unknown ggml type, a tensor outside the file, a
    /// safetensors JSON header that does not parse, …
    #[error("{}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the offset or tensor where that helps.
        message: String,
    },
    /// There are no tensors to digest: a directory without `*.safetensors` or `*.gguf`
    /// files, or files that hold no tensors.
    #[error("{}: no tensors to digest (expected a GGUF file, a .safetensors file, or a directory of either)", path.display())]
    Empty {
        /// The path that was given.
        path: PathBuf,
    },
    /// Two tensors share a name (two shards of one checkpoint, or one file).
    #[error("tensor {name:?} appears twice: in {} and in {}", first.display(), second.display())]
    DuplicateTensor {
        /// The tensor name.
        name: String,
        /// The file of the first occurrence.
        first: PathBuf,
        /// The file of the second occurrence (the same file when one file repeats a name).
        second: PathBuf,
    },
}

impl WeightsError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), source }
    }

    pub(crate) fn format(path: &Path, message: impl Into<String>) -> Self {
        Self::Format { path: path.to_path_buf(), message: message.into() }
    }
}
