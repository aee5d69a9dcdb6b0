//! The MPI transport (cargo feature `mpi`), through rsmpi: for clusters that
//! already launch jobs with `mpirun` / Slurm. Every collective, split
//! (`MPI_Comm_split`), send/recv and barrier is one MPI call on the group's
//! communicator.
//!
//! MPI is initialised once per process with `MPI_THREAD_SERIALIZED` (the
//! collectives run on the evaluator's communication thread, eager calls on
//! the caller's) and every call holds one process-wide lock; `MPI_Finalize`
//! runs at process exit. Dtypes MPI has no type for travel widened: `f16` and
//! `bf16` are reduced in `f32` and rounded once (as the other transports do),
//! `bool` as bytes normalised to 0/1 with max (or) and min (and).
//!
//! Failures: this transport has no collective timeout and no liveness check
//! (`MLX_DIST_TIMEOUT_MS` and `MLX_DIST_LIVENESS_MS` do not apply). A rank
//! that fails aborts the whole job (`MPI_Abort`), so that `mpirun` ends
//! every rank instead of letting the failed one wait in `MPI_Finalize` while
//! the others wait for it in a collective: on a panic (a panic hook, after
//! the previous hook printed the message), on an exit with a non-zero status
//! (glibc's `on_exit`, which sees the status; elsewhere through
//! [`crate::exit_rank`], which a program's top level calls on its error
//! path). A rank that is alive but never reaches a collective hangs the job
//! until it is interrupted or killed from outside. See
//! [`crate::launch::mpirun`] for what `mlx-launch` adds around `mpirun`.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytemuck::{Pod, Zeroable as _};
use half::{bf16, f16};
use mlx_array::Dtype;
use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Source};

use crate::error::{DistError, Result};
use crate::group::CommImpl;
use crate::reduce::ReduceOp;

/// The universe, dropped (finalising MPI) at process exit.
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
/// Set once `MPI_Finalize` ran: communicators dropped later must not be freed.
static FINALIZED: AtomicBool = AtomicBool::new(false);
/// Serialises every MPI call of the process.
static CALLS: Mutex<()> = Mutex::new(());
/// The outcome of initialisation.
static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Largest element count of one MPI call (counts are C ints).
const MAX_COUNT: usize = i32::MAX as usize;

extern "C" fn finalize_at_exit() {
    let _g = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    let u = UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take();
    FINALIZED.store(true, Ordering::SeqCst);
    drop(u);
}

/// Ends the whole job with `code` (`MPI_Abort` on the world) when MPI is
/// initialised and not finalised; returns otherwise. It takes no lock: the
/// thread that holds the call lock may be blocked in a collective for ever,
/// and an abort from another thread is what ends it.
pub(crate) fn abort_job(code: i32) {
    if INIT.get().is_none_or(|r| r.is_err()) || FINALIZED.load(Ordering::SeqCst) {
        return;
    }
    let code = if code == 0 { 1 } else { code };
    // SAFETY: MPI is initialised and not finalised; MPI_Abort may be called
    // from any thread and does not return when it works.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
        libc::_exit(code);
    }
}

/// Called by glibc's `exit` with the exit status: a failure aborts the job,
/// a success finalises MPI as [`finalize_at_exit`] does.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn finalize_or_abort_at_exit(status: libc::c_int, _arg: *mut libc::c_void) {
    if status != 0 {
        abort_job(status);
    }
    finalize_at_exit();
}

/// Registers what runs at exit. glibc's `on_exit` (not in the `libc` crate,
/// hence declared here) passes the exit status, so that a rank whose `main`
/// returns an error aborts the job; other C libraries finalise with `atexit`.
fn register_exit_handler() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn on_exit(
                f: extern "C" fn(libc::c_int, *mut libc::c_void),
                arg: *mut libc::c_void,
            ) -> libc::c_int;
        }
        // SAFETY: registering a plain extern "C" function; its argument is unused.
        unsafe { on_exit(finalize_or_abort_at_exit, std::ptr::null_mut()) };
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    // SAFETY: registering a plain extern "C" function with no arguments.
    unsafe {
        libc::atexit(finalize_at_exit)
    };
}

/// Makes a panic anywhere in this rank abort the job once the previous hook
/// (the message, a backtrace) has run.
fn abort_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        eprintln!("mlx-dist: this rank panicked; aborting the MPI job (MPI_Abort)");
        abort_job(1);
    }));
}

fn unavailable(reason: impl Into<String>) -> DistError {
    DistError::Unavailable {
        backend: "mpi",
        reason: reason.into(),
    }
}

/// Whether this process was started by an MPI launcher (`mpirun`, `srun`).
pub(crate) fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// Initialises MPI (once) and returns the world group.
pub(crate) fn world() -> Result<crate::Group> {
    INIT.get_or_init(|| {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or("MPI was already initialised by someone else")?;
        if provided < Threading::Serialized {
            return Err(format!(
                "the MPI library provides thread level {provided:?}, MPI_THREAD_SERIALIZED is needed"
            ));
        }
        *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(universe);
        register_exit_handler();
        abort_on_panic();
        Ok(())
    })
    .clone()
    .map_err(unavailable)?;
    let _g = lock();
    if FINALIZED.load(Ordering::SeqCst) {
        return Err(unavailable("MPI was finalised"));
    }
    Ok(crate::Group::from_impl(Arc::new(MpiComm::new(
        SimpleCommunicator::world(),
    ))))
}

fn lock() -> MutexGuard<'static, ()> {
    CALLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A group on an MPI communicator.
pub(crate) struct MpiComm {
    comm: ManuallyDrop<SimpleCommunicator>,
    rank: usize,
    size: usize,
    /// Send and receive space for all-reduces, kept between calls (it grows
    /// to twice the largest message, widened).
    scratch: std::sync::Mutex<Vec<u64>>,
}

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED and every use of the
// communicator holds the process-wide `CALLS` lock, so no two threads ever
// call MPI at once.
unsafe impl Send for MpiComm {}
// SAFETY: as above.
unsafe impl Sync for MpiComm {}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let _g = lock();
        if !FINALIZED.load(Ordering::SeqCst) {
            // SAFETY: dropped once, here; MPI is still initialised.
            unsafe { ManuallyDrop::drop(&mut self.comm) };
        }
    }
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

/// `bool` bytes reduce as 0/1 with max (sum and max are or) and min (and).
fn bool_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

fn too_big(op: &'static str, count: usize) -> DistError {
    DistError::InvalidArgument {
        op,
        msg: format!("{count} elements per rank exceed what one MPI call can carry ({MAX_COUNT})"),
    }
}

/// Bytes widened to the type MPI reduces them in, and back.
trait Widen {
    type Wide: Equivalence + Pod;
    /// Bytes of one element in the buffer.
    const BYTES: usize;
    fn widen(bytes: &[u8]) -> Vec<Self::Wide> {
        let mut out = vec![Self::Wide::zeroed(); bytes.len() / Self::BYTES];
        Self::widen_into(bytes, &mut out);
        out
    }
    fn widen_into(bytes: &[u8], out: &mut [Self::Wide]);
    fn narrow(wide: &[Self::Wide], out: &mut [u8]);
}

macro_rules! native {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Widen for $name {
            type Wide = $t;
            const BYTES: usize = size_of::<$t>();
            fn widen_into(bytes: &[u8], out: &mut [$t]) {
                bytemuck::cast_slice_mut::<$t, u8>(out).copy_from_slice(bytes);
            }
            fn narrow(wide: &[$t], out: &mut [u8]) {
                out.copy_from_slice(bytemuck::cast_slice(wide));
            }
        }
    };
}
native!(NativeU32, u32);
native!(NativeI32, i32);
native!(NativeI64, i64);
native!(NativeF32, f32);

struct BoolBytes;
impl Widen for BoolBytes {
    type Wide = u8;
    const BYTES: usize = 1;
    fn widen_into(bytes: &[u8], out: &mut [u8]) {
        for (o, &b) in out.iter_mut().zip(bytes) {
            *o = (b != 0) as u8;
        }
    }
    fn narrow(wide: &[u8], out: &mut [u8]) {
        out.copy_from_slice(wide);
    }
}

macro_rules! half_float {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Widen for $name {
            type Wide = f32;
            const BYTES: usize = 2;
            fn widen_into(bytes: &[u8], out: &mut [f32]) {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = <$t>::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            fn narrow(wide: &[f32], out: &mut [u8]) {
                for (o, v) in out.chunks_exact_mut(2).zip(wide) {
                    o.copy_from_slice(&<$t>::from_f32(*v).to_le_bytes());
                }
            }
        }
    };
}
half_float!(HalfF16, f16);
half_float!(HalfBf16, bf16);

impl MpiComm {
    fn new(comm: SimpleCommunicator) -> MpiComm {
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        MpiComm {
            comm: ManuallyDrop::new(comm),
            rank,
            size,
            scratch: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// All-reduce through the communicator's reused scratch buffers: Open
    /// MPI is several times slower on fresh allocations than on buffers it
    /// has seen (1 MiB: ~11 ms against ~1 ms), so nothing is allocated per call.
    fn all_reduce_as<W: Widen>(&self, buf: &mut [u8], op: SystemOperation) {
        let n = buf.len() / W::BYTES;
        let words = (n * size_of::<W::Wide>()).div_ceil(8);
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if scratch.len() < 2 * words {
            scratch.resize(2 * words, 0);
        }
        let (s, r) = scratch.split_at_mut(words);
        let send = &mut bytemuck::cast_slice_mut::<u64, W::Wide>(s)[..n];
        let recv = &mut bytemuck::cast_slice_mut::<u64, W::Wide>(&mut r[..words])[..n];
        W::widen_into(buf, send);
        for (s, r) in send.chunks(MAX_COUNT).zip(recv.chunks_mut(MAX_COUNT)) {
            self.comm.all_reduce_into(s, r, op);
        }
        W::narrow(recv, buf);
    }

    fn sum_scatter_as<W: Widen>(
        &self,
        input: &[u8],
        out: &mut [u8],
        op: SystemOperation,
    ) -> Result<()> {
        let send = W::widen(input);
        let block = send.len() / self.size;
        if block > MAX_COUNT {
            return Err(too_big("sum_scatter", block));
        }
        let mut recv = vec![W::Wide::zeroed(); block];
        self.comm
            .reduce_scatter_block_into(&send[..], &mut recv[..], op);
        W::narrow(&recv, out);
        Ok(())
    }
}

impl CommImpl for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let _g = lock();
        match dtype {
            Dtype::Bool => self.all_reduce_as::<BoolBytes>(buf, bool_op(op)),
            Dtype::U32 => self.all_reduce_as::<NativeU32>(buf, system_op(op)),
            Dtype::I32 => self.all_reduce_as::<NativeI32>(buf, system_op(op)),
            Dtype::I64 => self.all_reduce_as::<NativeI64>(buf, system_op(op)),
            Dtype::F32 => self.all_reduce_as::<NativeF32>(buf, system_op(op)),
            Dtype::F16 => self.all_reduce_as::<HalfF16>(buf, system_op(op)),
            Dtype::BF16 => self.all_reduce_as::<HalfBf16>(buf, system_op(op)),
        }
        Ok(())
    }

    fn all_gather(&self, input: &[u8], out: &mut [u8], _dtype: Dtype) -> Result<()> {
        if input.len() > MAX_COUNT {
            return Err(too_big("all_gather", input.len()));
        }
        if input.is_empty() {
            // Open MPI refuses a zero count with an empty (dangling) buffer; nothing travels anyway.
            return Ok(());
        }
        let _g = lock();
        self.comm.all_gather_into(input, out);
        Ok(())
    }

    fn sum_scatter(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()> {
        if input.is_empty() {
            return Ok(());
        }
        let _g = lock();
        let sum = system_op(ReduceOp::Sum);
        match dtype {
            Dtype::Bool => self.sum_scatter_as::<BoolBytes>(input, out, bool_op(ReduceOp::Sum)),
            Dtype::U32 => self.sum_scatter_as::<NativeU32>(input, out, sum),
            Dtype::I32 => self.sum_scatter_as::<NativeI32>(input, out, sum),
            Dtype::I64 => self.sum_scatter_as::<NativeI64>(input, out, sum),
            Dtype::F32 => self.sum_scatter_as::<NativeF32>(input, out, sum),
            Dtype::F16 => self.sum_scatter_as::<HalfF16>(input, out, sum),
            Dtype::BF16 => self.sum_scatter_as::<HalfBf16>(input, out, sum),
        }
    }

    fn send(&self, buf: &[u8], _dtype: Dtype, dst: usize) -> Result<()> {
        let _g = lock();
        let p = self.comm.process_at_rank(dst as i32);
        // A zero-length message still travels, so recv always has one to match.
        let mut chunks = buf.chunks(MAX_COUNT).peekable();
        if chunks.peek().is_none() {
            p.send(&buf[..0]);
        }
        for c in chunks {
            p.send(c);
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8], _dtype: Dtype, src: usize) -> Result<()> {
        let _g = lock();
        let p = self.comm.process_at_rank(src as i32);
        if buf.is_empty() {
            let mut none: [u8; 0] = [];
            p.receive_into(&mut none[..]);
            return Ok(());
        }
        for c in buf.chunks_mut(MAX_COUNT) {
            let status = p.receive_into(c);
            let got = status.count(u8::equivalent_datatype()) as usize;
            if got != c.len() {
                return Err(DistError::Mismatch {
                    peer: src,
                    ours: format!("recv of {} bytes", c.len()),
                    theirs: format!("a message of {got} bytes"),
                });
            }
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        let _g = lock();
        self.comm.barrier();
        Ok(())
    }

    fn split(&self, color: i32, key: i32) -> Result<Arc<dyn CommImpl>> {
        if color < 0 {
            return Err(DistError::InvalidArgument {
                op: "split",
                msg: format!("colour {color} is negative (MPI_UNDEFINED is not a group)"),
            });
        }
        let _g = lock();
        // Ties in `key` keep the parent's order, as MPI_Comm_split does.
        let comm = self
            .comm
            .split_by_color_with_key(Color::with_value(color), key)
            .ok_or_else(|| DistError::InvalidArgument {
                op: "split",
                msg: format!("MPI_Comm_split gave no communicator for colour {color}"),
            })?;
        Ok(Arc::new(MpiComm::new(comm)))
    }
}
