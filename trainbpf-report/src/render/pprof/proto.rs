//! The messages of pprof's `profile.proto` (package `perftools.profiles`,
//! <https://github.com/google/pprof/blob/main/proto/profile.proto>) as prost
//! structs: the field numbers and types are the .proto's, so prost encodes
//! and decodes the wire format and no protoc runs at build time. Only the
//! fields every reader knows; readers skip what a message lacks.

/// A whole profile. Every string is an index into `string_table`, whose
/// first entry is "".
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub(crate) sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub(crate) location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub(crate) function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub(crate) string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub(crate) drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub(crate) keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub(crate) time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub(crate) duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub(crate) period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub(crate) period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub(crate) comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub(crate) default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ValueType {
    #[prost(int64, tag = "1")]
    pub(crate) r#type: i64,
    #[prost(int64, tag = "2")]
    pub(crate) unit: i64,
}

/// Values at one stack: `location_id[0]` is the innermost frame.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub(crate) value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) label: Vec<Label>,
}

/// `str` or `num`, not both.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Label {
    #[prost(int64, tag = "1")]
    pub(crate) key: i64,
    #[prost(int64, tag = "2")]
    pub(crate) str: i64,
    #[prost(int64, tag = "3")]
    pub(crate) num: i64,
    #[prost(int64, tag = "4")]
    pub(crate) num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Mapping {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub(crate) file_offset: u64,
    #[prost(int64, tag = "5")]
    pub(crate) filename: i64,
    #[prost(int64, tag = "6")]
    pub(crate) build_id: i64,
    #[prost(bool, tag = "7")]
    pub(crate) has_functions: bool,
    #[prost(bool, tag = "8")]
    pub(crate) has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub(crate) has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub(crate) has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Location {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) address: u64,
    #[prost(message, repeated, tag = "4")]
    pub(crate) line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub(crate) is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Line {
    #[prost(uint64, tag = "1")]
    pub(crate) function_id: u64,
    #[prost(int64, tag = "2")]
    pub(crate) line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Function {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(int64, tag = "2")]
    pub(crate) name: i64,
    #[prost(int64, tag = "3")]
    pub(crate) system_name: i64,
    #[prost(int64, tag = "4")]
    pub(crate) filename: i64,
    #[prost(int64, tag = "5")]
    pub(crate) start_line: i64,
}
