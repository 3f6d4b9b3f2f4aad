//! TODO(helper): buffer
