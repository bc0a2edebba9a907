//! What this crate's integration tests share (each test is a crate of its
//! own and takes the module with `mod support;`): the S3-compatible test
//! servers, from `strata-testkit` (which `client`'s tests use too).

pub(crate) use strata_testkit::servers;
