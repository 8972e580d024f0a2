//! Line tables of one function, as five CPython versions compiled it
//! (each pyenv interpreter compiled the source below and printed the
//! table and `dis.findlinestarts`/`co_lines()`), with the line CPython
//! itself gives each instruction.

pub struct Fixture {
    pub minor: u8,
    pub first_line: i32,
    /// The table, in hex.
    pub table: &'static str,
    /// `byte_offset:line` pairs; `-` where CPython gives no line.
    pub lines: &'static str,
}

// The source each interpreter compiled (a branch, a multi-line
// statement, a comprehension and a 150-line gap, so that every format's
// long entries occur):
//
//     def f(a, b):
//         x = a + b
//         if x > 3:
//             y = [i
//                  for i in range(x)]
//         else:
//             y = None
//         # pad            (150 such lines)
//         return (x,
//                 y)

#[rustfmt::skip]
pub const FIXTURES: &[Fixture] = &[
    // CPython 3.9's table for the fixture function, and the line of each
    // instruction's byte offset, from `dis`/`co_lines()`.
    Fixture {
        minor: 9,
        first_line: 1,
        table: "000108010801060106ff0803047f0018020102ff",
        lines: "0:2 2:2 4:2 6:2 8:3 10:3 12:3 14:3 16:4 18:4 20:4 22:5 24:5 26:5 28:4 30:4 32:4 34:4 36:7 38:7 40:158 42:159 44:158 46:158",
    },
    // CPython 3.10's table for the fixture function, and the line of each
    // instruction's byte offset, from `dis`/`co_lines()`.
    Fixture {
        minor: 10,
        first_line: 1,
        table: "080108010601060106ff007f021b020104ff008104e8007f0218020104ff",
        lines: "0:2 2:2 4:2 6:2 8:3 10:3 12:3 14:3 16:4 18:4 20:4 22:5 24:5 26:5 28:4 30:4 32:4 34:158 36:159 38:158 40:158 42:7 44:7 46:158 48:159 50:158 52:158",
    },
    // CPython 3.11's table for the fixture function, and the line of each
    // instruction's byte offset, from `dis`/`co_lines()`.
    Fixture {
        minor: 11,
        first_line: 1,
        table: "8000d80809884189058041d80708883182758075f002010d20f000010d20dd161b984191689468f003010d20f100010d20f400010d2088018801f006000d118801f06e04000d0ed80c0df003010c0ff00001050f",
        lines: "0:1 2:2 4:2 6:2 8:2 10:2 12:3 14:3 16:3 18:3 20:3 22:3 24:4 26:4 28:5 30:5 32:5 34:5 36:5 38:5 40:5 42:5 44:5 46:5 48:5 50:5 52:5 54:5 56:4 58:4 60:4 62:4 64:4 66:4 68:4 70:4 72:4 74:4 76:7 78:7 80:158 82:159 84:158 86:158",
    },
    // CPython 3.12's table for the fixture function, and the line of each
    // instruction's byte offset, from `dis`/`co_lines()`.
    Fixture {
        minor: 12,
        first_line: 1,
        table: "8000d80809884189058041d8070888318275e4161b98419368f603010d20d81112f203000e0ff000010d208801f000010d20f07404000d0ed80c0df003010c0ff00001050ff06f04000d118801f06e04000d0ed80c0df003010c0ff00001050ff9f27504010d20",
        lines: "0:1 2:2 4:2 6:2 8:2 10:2 12:3 14:3 16:3 18:3 20:3 22:5 24:5 26:5 28:5 30:5 32:5 34:5 36:5 38:5 40:5 42:4 44:4 46:4 48:4 50:4 52:4 54:4 56:5 58:4 60:4 62:4 64:4 66:4 68:4 70:158 72:159 74:158 76:158 78:7 80:7 82:158 84:159 86:158 88:158 90:- 92:- 94:4 96:4 98:4",
    },
    // CPython 3.13's table for the fixture function, and the line of each
    // instruction's byte offset, from `dis`/`co_lines()`.
    Fixture {
        minor: 13,
        first_line: 1,
        table: "8000d8080989058041d8070888318375e4161b98419468f303010d20d9161e9011f303000e0fd9161ef00300090af000010d20f07404000d0ed80c0df003010c0ff00001050ff06f04000d118801f06e04000d0ed80c0df003010c0ff00001050ff9f27504010d20",
        lines: "0:1 2:2 4:2 6:2 8:2 10:3 12:3 14:3 16:3 18:3 20:3 22:5 24:5 26:5 28:5 30:5 32:5 34:5 36:5 38:5 40:5 42:5 44:4 46:4 48:4 50:4 52:5 54:5 56:5 58:4 60:4 62:4 64:4 66:5 68:5 70:4 72:4 74:158 76:159 78:158 80:158 82:7 84:7 86:158 88:159 90:158 92:158 94:- 96:- 98:4 100:4 102:4",
    },
];
