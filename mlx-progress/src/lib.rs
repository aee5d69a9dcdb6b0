//! Progress reporting (being written: see issue 21).
