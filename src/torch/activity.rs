//! What the program was doing at an OOM, as the shim saw it (`_activity` in the shim): the evidence an
//! OOM's phase is read from (rules::phase). Each field is `None` where the shim could not tell.

use serde::{Deserialize, Serialize};

/// The shim's reading of the program at an OOM.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(default)]
pub struct Activity {
    /// A backward (torch.autograd.backward, which Tensor.backward calls) was running.
    #[serde(rename = "bw")]
    pub in_backward: Option<bool>,
    /// An optimizer's step() was running (between its pre- and post-hooks).
    #[serde(rename = "opt")]
    pub in_optimizer_step: Option<bool>,
    /// Backward calls begun so far.
    #[serde(rename = "bws")]
    pub backwards: Option<u64>,
    /// Optimizer steps ended so far.
    pub steps: Option<u64>,
    /// Grad mode on the failing thread (`torch.is_grad_enabled()`).
    pub grad: Option<bool>,
    /// Inference mode on the failing thread (`torch.is_inference_mode_enabled()`).
    #[serde(rename = "inf")]
    pub inference_mode: Option<bool>,
    /// Calls of the outermost module that had returned, while the shim counted them (from its first call
    /// on; not where the module is compiled or called its own way, nor in a loop too fast to count).
    #[serde(rename = "fwd")]
    pub forwards: Option<u64>,
    /// Of those, the calls since the last backward began: forward calls no backward followed.
    #[serde(rename = "fg")]
    pub forwards_without_backward: Option<u64>,
    /// The most forward calls that ever preceded one backward (a step may call its model more than once:
    /// two views, a GAN's discriminator); 0 before the first backward.
    #[serde(rename = "fpb")]
    pub forwards_per_backward: Option<u64>,
    /// The count of forward calls that most backwards had before them (the larger on a tie): what one
    /// step calls its model, which a validation every few steps does not change as it changes the most
    /// (`forwards_per_backward`); 0 before the first backward. Absent from shims before it.
    #[serde(rename = "fps", skip_serializing_if = "Option::is_none")]
    pub forwards_per_step: Option<u64>,
    /// The outermost module's training flag (`module.training`: false after eval()).
    #[serde(rename = "train")]
    pub training: Option<bool>,
    /// The program had made an optimizer (a `torch.optim.Optimizer` of any kind) by then. Absent from shims
    /// before it.
    #[serde(rename = "optim", skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<bool>,
}

impl Activity {
    /// Reads the `act` field of an `oom` message; `None` when absent or not an object.
    pub fn from_message(v: &serde_json::Value) -> Option<Activity> {
        serde_json::from_value(v.get("act")?.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_shim_could_not_tell_stays_unknown() {
        let v = serde_json::json!({"act": {"bw": true, "opt": null, "bws": 3, "steps": 2, "grad": false,
            "inf": false, "fwd": null, "fg": null, "train": null}});
        let a = Activity::from_message(&v).unwrap();
        assert_eq!(a.in_backward, Some(true));
        assert_eq!(a.in_optimizer_step, None);
        assert_eq!(
            (a.backwards, a.steps, a.grad),
            (Some(3), Some(2), Some(false))
        );
        assert_eq!((a.forwards, a.training), (None, None));
        assert_eq!(Activity::from_message(&serde_json::json!({})), None);
    }
}
