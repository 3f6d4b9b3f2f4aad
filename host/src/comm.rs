//! TODO(helper): comm
