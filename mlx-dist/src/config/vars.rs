//! The names of the environment variables a rank reads (see [`super`] for
//! what each means). A leaf: the parsers of the environment import it.

/// Environment variable: this process's rank.
pub const ENV_RANK: &str = "MLX_RANK";
/// Environment variable: the world size.
pub const ENV_WORLD: &str = "MLX_WORLD_SIZE";
/// Environment variable: path of an MLX-style JSON host file.
pub const ENV_HOSTFILE: &str = "MLX_HOSTFILE";
/// Environment variable: comma-separated `host:port` per rank; a rank with
/// several network interfaces lists them joined by `|` (`10.0.0.1:5000|10.0.1.1:5000`).
pub const ENV_HOSTS: &str = "MLX_DIST_HOSTS";
/// Environment variable: job id, 32 hex digits.
pub const ENV_JOB_ID: &str = "MLX_DIST_JOB_ID";
/// Environment variable: job secret, hex.
pub const ENV_SECRET: &str = "MLX_DIST_JOB_SECRET";
/// Environment variable: path of a file holding the job secret (hex),
/// which group and others must not be able to read.
pub const ENV_SECRET_FILE: &str = "MLX_DIST_JOB_SECRET_FILE";
/// Environment variable: `1` derives the job secret from the host list when
/// none is given (anyone who can read the host list can then join the job).
pub const ENV_INSECURE_SECRET: &str = "MLX_DIST_INSECURE_DERIVED_SECRET";
/// Environment variable: `1` listens on every interface, not only the rank's address.
pub const ENV_BIND_ALL: &str = "MLX_DIST_BIND_ALL";
/// Environment variable: backend name.
pub const ENV_BACKEND: &str = "MLX_DIST_BACKEND";
/// Environment variable: connections per peer and direction.
pub const ENV_CONNECTIONS: &str = "MLX_DIST_CONNECTIONS";
/// Environment variable: collective timeout in milliseconds.
pub const ENV_TIMEOUT_MS: &str = "MLX_DIST_TIMEOUT_MS";
/// Environment variable: liveness timeout in milliseconds.
pub const ENV_LIVENESS_MS: &str = "MLX_DIST_LIVENESS_MS";
/// Environment variable: connect deadline in milliseconds.
pub const ENV_CONNECT_TIMEOUT_MS: &str = "MLX_DIST_CONNECT_TIMEOUT_MS";
/// Environment variable: the job's QUIC certificate (hex DER).
pub const ENV_QUIC_CERT: &str = "MLX_DIST_QUIC_CERT";
/// Environment variable: the QUIC certificate's private key (hex PKCS#8 DER).
pub const ENV_QUIC_KEY: &str = "MLX_DIST_QUIC_KEY";
/// Environment variable: SHA-256 fingerprint of the QUIC certificate (hex).
pub const ENV_QUIC_FINGERPRINT: &str = "MLX_DIST_QUIC_FINGERPRINT";
/// Environment variable: TCP socket buffer size in bytes (0 keeps the kernel's autotuning).
pub const ENV_SOCKET_BUFFER: &str = "MLX_DIST_SOCKET_BUFFER";
/// Environment variable: message size from which the TCP ring uses threads per lane.
pub const ENV_THREADED_BYTES: &str = "MLX_DIST_THREADED_BYTES";
/// Environment variable: `0` keeps ranks on one host from sharing memory
/// (every byte then goes over TCP); anything else, or unset, allows it.
pub const ENV_SHM: &str = "MLX_DIST_SHM";
/// Environment variable: how many times the launcher restarted the job
/// before this attempt (0 on the first; see [`super::restart_count`]).
pub const ENV_RESTART_COUNT: &str = "MLX_RESTART_COUNT";
