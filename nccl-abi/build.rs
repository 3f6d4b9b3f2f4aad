//! Gives the C library NCCL's SONAME, so that a copy or link named `libnccl.so.2` is what the
//! dynamic loader and `ldd` see.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
}
