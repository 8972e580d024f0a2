//! Python frames in growth stacks and at death, on each CPython here.

mod attach;
mod cext;
mod cow;
mod exec;
mod growth;
mod stacks;
mod thread;
