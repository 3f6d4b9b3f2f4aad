//! TODO(helper): sim
