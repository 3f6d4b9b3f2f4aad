//! TODO(helper): collectives
