//! What a job or a local user could make the root recorder or `sudo trainbpf report` do: each test plays one attacker.

mod cgroups;
mod files;
mod input;
mod root_opens;
mod sudo;
mod terminal;
