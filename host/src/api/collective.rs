//! What a call asks for, as plain data: [`Collective`] and [`Need`] (they live in
//! [`crate::plan::collective`], where the plan is chosen from them).

pub use crate::plan::collective::{Collective, Need};
