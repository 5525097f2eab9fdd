//! Trampolines that let C call Rust closures.
//!
//! A closure's panic must not unwind into C: each trampoline runs the closure under `catch_unwind`,
//! keeps the payload, and returns nonzero so that the library cancels the operation cleanly. Once
//! the C call has returned, the caller re-raises the panic with [`CallbackState::finish`].

use std::any::Any;
use std::ffi::c_void;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// A closure and what happened to it during one C call.
pub(crate) struct CallbackState<F, E = ()> {
    pub(crate) callback: F,
    /// The reason the closure gave for stopping, if it stopped with one.
    pub(crate) stopped: Option<E>,
    panic: Option<Box<dyn Any + Send + 'static>>,
}

impl<F, E> CallbackState<F, E> {
    pub(crate) fn new(callback: F) -> Self {
        CallbackState { callback, stopped: None, panic: None }
    }

    /// The user data pointer to hand to C. `self` must stay in place until the C call returns.
    pub(crate) fn as_user_data(&mut self) -> *mut c_void {
        (self as *mut Self).cast()
    }

    /// Runs the closure through `call`; a panic or a stop becomes a nonzero status.
    fn run(&mut self, call: impl FnOnce(&mut F) -> Result<(), E>) -> i32 {
        if self.panic.is_some() || self.stopped.is_some() {
            return 1; // already cancelled: never run the closure again
        }
        match catch_unwind(AssertUnwindSafe(|| call(&mut self.callback))) {
            Ok(Ok(())) => 0,
            Ok(Err(reason)) => {
                self.stopped = Some(reason);
                1
            }
            Err(payload) => {
                self.panic = Some(payload);
                1
            }
        }
    }

    /// After the C call: re-raises a panic of the closure, else returns why it stopped, if it did.
    pub(crate) fn finish(self) -> Option<E> {
        if let Some(payload) = self.panic {
            resume_unwind(payload);
        }
        self.stopped
    }
}

/// `peft_progress_fn` over `FnMut(done, total) -> ControlFlow<()>`.
pub(crate) unsafe extern "C" fn progress_trampoline<F>(user_data: *mut c_void, done: u64, total: u64) -> i32
where
    F: FnMut(u64, u64) -> ControlFlow<()>,
{
    // SAFETY: user_data is the CallbackState<F> the caller passed, alive for the whole C call, and
    // the library calls back on the calling thread only.
    let state = &mut *user_data.cast::<CallbackState<F>>();
    state.run(|f| match f(done, total) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(()),
    })
}

/// `peft_tensor_source_fn` over `FnMut(offset, &mut [u8]) -> std::io::Result<()>`.
pub(crate) unsafe extern "C" fn source_trampoline<F>(
    user_data: *mut c_void,
    offset: u64,
    dst: *mut c_void,
    nbytes: u64,
) -> i32
where
    F: FnMut(u64, &mut [u8]) -> std::io::Result<()>,
{
    // SAFETY: as for progress_trampoline.
    let state = &mut *user_data.cast::<CallbackState<F, std::io::Error>>();
    let len = match usize::try_from(nbytes) {
        Ok(len) => len,
        Err(_) => return 1,
    };
    let chunk: &mut [u8] = if len == 0 || dst.is_null() {
        &mut []
    } else {
        // The chunk may be uninitialised memory; zero it so that the closure sees plain bytes.
        std::ptr::write_bytes(dst.cast::<u8>(), 0, len);
        // SAFETY: the library gives `nbytes` writable bytes, valid for this call.
        std::slice::from_raw_parts_mut(dst.cast::<u8>(), len)
    };
    state.run(|f| f(offset, chunk))
}
