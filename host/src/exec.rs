//! TODO(helper): exec
