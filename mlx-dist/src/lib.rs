//! Distributed groups, collectives over TCP/QUIC/MPI and the `mlx-launch` launcher (filled by a later issue).
