//! A producer thread ahead of its consumer: it makes items one after another into a bounded
//! channel and stops at its first error (handed on) or when the consumer goes away.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// Items made on a thread of their own, at most `capacity` ahead.
pub(crate) struct Background<T> {
    name: &'static str,
    receiver: Receiver<Result<T>>,
    handle: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Background<T> {
    /// Starts the thread `thread` (`what` in messages: "the data loader"), calling `next`
    /// until it fails or the consumer is dropped.
    pub(crate) fn spawn(
        thread: &str,
        name: &'static str,
        capacity: usize,
        mut next: impl FnMut() -> Result<T> + Send + 'static,
    ) -> Result<Self> {
        let (sender, receiver) = sync_channel(capacity.max(1));
        let handle = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || loop {
                let item = next();
                let failed = item.is_err();
                if sender.send(item).is_err() || failed {
                    return;
                }
            })
            .map_err(|e| Error::Run(format!("starting the {name} thread: {e}")))?;
        Ok(Background {
            name,
            receiver,
            handle: Some(handle),
        })
    }

    /// The next item, or the thread's error.
    pub(crate) fn recv(&self) -> Result<T> {
        match self.receiver.recv() {
            Ok(item) => item,
            Err(_) => Err(Error::Data(format!("the {} stopped", self.name))),
        }
    }
}

impl<T> Drop for Background<T> {
    fn drop(&mut self) {
        // Disconnecting the channel fails the thread's next (or pending) send, which ends it.
        if let Some(handle) = self.handle.take() {
            drop(std::mem::replace(&mut self.receiver, sync_channel(1).1));
            let _ = handle.join();
        }
    }
}
