use std::time::{Duration, Instant};

use super::create::validate_ordinals;
use super::*;
use crate::resources::poll_until;
use crate::Error;

#[test]
fn ordinals_are_checked() {
    assert_eq!(
        validate_ordinals(&[], 2),
        Err(Error::TooFewDevices {
            needed: 1,
            found: 2
        })
    );
    assert_eq!(validate_ordinals(&[0, 1], 2), Ok(()));
    assert_eq!(validate_ordinals(&[1, 0], 2), Ok(()));
    assert!(matches!(
        validate_ordinals(&[0, 2], 2),
        Err(Error::BadDevice { ordinal: 2, .. })
    ));
    assert!(matches!(
        validate_ordinals(&[0], 0),
        Err(Error::BadDevice { ordinal: 0, .. })
    ));
    let e = validate_ordinals(&[1, 0, 1], 2).unwrap_err();
    assert!(
        matches!(&e, Error::BadDevice { ordinal: 1, reason } if reason.contains("more than once"))
    );
}

#[test]
fn polling_ends_at_the_limit_and_sleeps() {
    let t0 = Instant::now();
    let mut polls = 0u32;
    let r = poll_until::<()>(Some(Duration::from_millis(50)), || {
        polls += 1;
        Ok(None)
    });
    let took = t0.elapsed();
    assert_eq!(r, Ok(None));
    assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(2), "{took:?}");
    // Yields, then sleeps of 10 us growing to 1 ms: far fewer polls than a busy spin.
    assert!(polls < 2_000, "{polls} polls in {took:?}");
    let mut left = 3;
    let r = poll_until(None, || {
        left -= 1;
        Ok((left == 0).then_some(7))
    });
    assert_eq!(r, Ok(Some(7)));
    let e = poll_until::<()>(None, || Err(Error::NoDriver));
    assert_eq!(e, Err(Error::NoDriver));
}

#[test]
fn reliability_errors_say_what_happened() {
    let t = Error::Timeout {
        rank: Some(0),
        peer: Some(1),
        what: "a device-side wait of 1s".into(),
    };
    assert!(t.to_string().contains("rank 0 timed out waiting for rank 1"), "{t}");
    assert_eq!(t.rank(), Some(0));
    let p = Error::PartlyEnqueued {
        enqueued: vec![0],
        cause: Box::new(Error::Cuda {
            call: "cuLaunchKernel",
            code: "CUDA_ERROR_LAUNCH_FAILED".into(),
            rank: Some(1),
        }),
    };
    assert_eq!(p.rank(), Some(1));
    assert!(p.to_string().contains("[0]") && p.to_string().contains("rank 1"), "{p}");
    let a = Error::Aborted {
        reason: "aborted by the caller".into(),
    };
    assert!(a.to_string().contains("make a new one"), "{a}");
}

#[test]
fn communicator_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Communicator>();
}

#[test]
fn without_a_driver_construction_fails_cleanly() {
    // SAFETY: only probes for the library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        return; // covered by the GPU tests
    }
    assert_eq!(Communicator::new(&[0]).unwrap_err(), Error::NoDriver);
    assert_eq!(Communicator::new(&[]).unwrap_err(), Error::NoDriver);
    assert_eq!(Communicator::all().unwrap_err(), Error::NoDriver);
}
