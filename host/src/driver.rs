//! TODO(helper): driver
