//! What a submission may reach: its tenant (from the broker-checked `user_id`), the contexts
//! its turns use (the tenant's own, fixed for a session at its first turn), and the reply queue
//! its answers go to (its tenant's; an instance's when `reply_to` names one of them).

use crate::config::{Publisher, Settings, Tenant};
use crate::contracts::{
    ApiError, ContextId, ErrorCode, FollowUp, InstanceName, InvalidName, ReplyAddress, TenantName,
    UserTurn,
};
use crate::rules::turn_hint;
use crate::store::SessionOwner;

/// Who sent a submission.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller<'a> {
    /// Its tenant, if tenants are configured.
    pub name: Option<&'a TenantName>,
    /// The tenant's configuration.
    pub tenant: Option<&'a Tenant>,
}

impl<'a> Caller<'a> {
    /// The caller that [`caller_of`] found.
    pub fn of(found: &'a Option<(TenantName, &'a Tenant)>) -> Self {
        Caller { name: found.as_ref().map(|(n, _)| n), tenant: found.as_ref().map(|(_, t)| *t) }
    }
}

/// The tenant of a publishing user; `Err` with the reason when tenants are configured and the
/// user is none of theirs (there is then no reply queue the server may answer on).
pub(super) fn caller_of<'a>(
    settings: &'a Settings,
    user_id: Option<&str>,
) -> Result<Option<(TenantName, &'a Tenant)>, UnknownPublisher> {
    match settings.publisher(user_id) {
        Publisher::SingleTenant => Ok(None),
        Publisher::Tenant(name, tenant) => Ok(Some((name, tenant))),
        Publisher::Unknown => Err(match user_id {
            None => UnknownPublisher::NoUserId,
            Some(u) => UnknownPublisher::NotATenant(clip(u)),
        }),
    }
}

/// Why a publisher is no configured tenant's.
#[derive(Debug, thiserror::Error)]
pub(super) enum UnknownPublisher {
    /// The message names no user.
    #[error("the message has no user_id property, so its tenant is unknown")]
    NoUserId,
    /// The user is no tenant's.
    #[error("user `{0}` belongs to no configured tenant")]
    NotATenant(String),
}

fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Where the replies to a submission go, from its `reply_to`: none or the session's own reply
/// queue mean that queue; `<prefix>.instance.[<tenant>.]<name>` means that backend instance's
/// queue. Anything else is refused: the server publishes only to the caller's reply queues.
pub(super) fn reply_target(
    prefix: &str,
    tenant: Option<&TenantName>,
    reply_to: Option<&str>,
    body: &[u8],
) -> Result<Option<InstanceName>, ApiError> {
    let invalid = |m: String| ApiError::new(ErrorCode::RequestReplyToInvalid, m);
    let Some(queue) = reply_to.filter(|q| !q.is_empty()) else { return Ok(None) };
    // Bytes that are not UTF-8 arrive as U+FFFD (vendor/README.md); no reply queue's name has it.
    if queue.contains(char::REPLACEMENT_CHARACTER) {
        return Err(invalid(
            "reply_to is not UTF-8 (its invalid bytes read as U+FFFD); nothing was published to it"
                .into(),
        ));
    }
    let scope = tenant.map_or_else(String::new, |t| format!("{t}."));
    if let Some(rest) = queue.strip_prefix(prefix).and_then(|q| q.strip_prefix(".instance.")) {
        let Some(name) = rest.strip_prefix(scope.as_str()) else {
            return Err(invalid(format!(
                "reply_to: an instance queue of this publisher is `{prefix}.instance.{scope}<name>`"
            )));
        };
        return name.parse().map(Some).map_err(|e: InvalidName| invalid(format!("reply_to: {e}")));
    }
    let session = turn_hint(body).0.map(|s| format!("{prefix}.session.{scope}{s}"));
    if session.as_deref() == Some(queue) {
        return Ok(None);
    }
    let shown: String = queue.chars().take(80).collect();
    Err(invalid(format!(
        "reply_to `{shown}` is neither this session's reply queue nor `{prefix}.instance.{scope}<name>`"
    )))
}

/// The address of replies for `caller` at `instance`.
pub(super) fn address(caller: Caller<'_>, instance: Option<InstanceName>) -> ReplyAddress {
    ReplyAddress { tenant: caller.name.cloned(), instance }
}

/// The contexts a turn of `caller` uses, checked to exist and to be the caller's (a context of
/// another tenant gets the same answer as one that does not exist). The AgentContext is the
/// one the session was created with (endpoint, key and collection stay the session's); the
/// ConversationContext (the mode) is the one the turn names, else the session's current one,
/// else the tenant's default.
pub(super) fn contexts(
    settings: &Settings,
    caller: Caller<'_>,
    turn: &UserTurn,
    session: Option<&SessionOwner>,
) -> Result<(String, String), Vec<ApiError>> {
    let stored = |f: fn(&SessionOwner) -> &Option<String>| session.and_then(|s| f(s).clone());
    let agent = stored(|s| &s.agent_context_id)
        .unwrap_or_else(|| settings.agent_context_id_for(caller.tenant, turn.agent_context_id()));
    let named_mode = turn.conversation_context_id();
    let conversation = match (named_mode, stored(|s| &s.conversation_context_id)) {
        (None, Some(current)) => current,
        (named, _) => settings.conversation_context_id_for(caller.tenant, named),
    };
    let named = |id: Option<&ContextId>, fixed: &str| id.is_some_and(|c| c.as_str() != fixed);
    if named(turn.agent_context_id(), &agent) {
        return Err(vec![ApiError::new(
            ErrorCode::SessionContextFixed,
            format!("this session uses AgentContextId `{agent}`; a later turn may name it or none (the ConversationContextId may change per turn)"),
        )]);
    }
    let mut errors = Vec::new();
    let allowed = |known: bool, mine: fn(&Tenant, &str) -> bool, id: &str| {
        known && caller.tenant.is_none_or(|t| mine(t, id))
    };
    let known = settings.conversation_contexts.contains_key(&conversation);
    if !allowed(known, Tenant::may_use_conversation, &conversation) {
        errors.push(ApiError::at(
            ErrorCode::UnknownConversationContext,
            "ConversationContextId",
            format!("no conversation context `{conversation}` is configured"),
        ));
    }
    if !allowed(settings.agent_contexts.contains_key(&agent), Tenant::may_use_agent, &agent) {
        errors.push(ApiError::at(
            ErrorCode::UnknownAgentContext,
            "AgentContextId",
            format!("no agent context `{agent}` is configured"),
        ));
    }
    if errors.is_empty() {
        Ok((agent, conversation))
    } else {
        Err(errors)
    }
}

/// The follow-up policy of `turn` in `conversation`: the request's `FollowUp` where the context
/// allows it, else the context's own.
pub(super) fn follow_up(
    settings: &Settings,
    conversation: &str,
    turn: &UserTurn,
) -> Result<FollowUp, Vec<ApiError>> {
    let context = settings.conversation_contexts.get(conversation);
    // A context that steers by default enqueues what cannot steer (a request that asks to
    // steer with more than an instruction was refused at validation).
    let own = match context.map(|c| c.follow_up).unwrap_or_default() {
        FollowUp::Steer if !turn.only_instruction() => FollowUp::Enqueue,
        own => own,
    };
    match turn.follow_up() {
        None => Ok(own),
        Some(chosen) if context.is_some_and(|c| c.follow_up_allowed.contains(&chosen)) => {
            Ok(chosen)
        }
        Some(chosen) => {
            let allowed = context.map(|c| c.follow_up_allowed.as_slice()).unwrap_or_default();
            let allowed: Vec<&str> = allowed.iter().map(|f| f.as_str()).collect();
            Err(vec![ApiError::at(
                ErrorCode::FollowUpNotAllowed,
                "FollowUp",
                format!(
                    "conversation context `{conversation}` does not let a request choose `{}` (it allows: {})",
                    chosen.as_str(),
                    if allowed.is_empty() { "none".to_owned() } else { allowed.join(", ") }
                ),
            )])
        }
    }
}

/// The turn with its contexts written in, so every later stage uses the session's.
pub(super) fn with_contexts(turn: &UserTurn, agent: &str, conversation: &str) -> Option<UserTurn> {
    let mut turn = turn.clone();
    turn.agent_context_id = Some(agent.parse().ok()?);
    turn.conversation_context_id = Some(conversation.parse().ok()?);
    Some(turn)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"SessionId":"9b1d1c1e-7c1a-4c47-9a55-6f1c2a8b3d4e"}"#;

    fn target(tenant: Option<&str>, reply_to: &str) -> Result<Option<String>, &'static str> {
        let tenant: Option<TenantName> = tenant.map(|t| t.parse().unwrap());
        reply_target("p", tenant.as_ref(), Some(reply_to), BODY)
            .map(|i| i.map(|n| n.to_string()))
            .map_err(|e| e.code.as_str())
    }

    #[test]
    fn a_tenant_may_name_only_its_own_reply_queues() {
        let sid = "9b1d1c1e-7c1a-4c47-9a55-6f1c2a8b3d4e";
        assert_eq!(target(Some("a"), "p.instance.a.web-1"), Ok(Some("web-1".into())));
        assert_eq!(target(Some("a"), &format!("p.session.a.{sid}")), Ok(None));
        let refused = Err("request.reply_to_invalid");
        assert_eq!(target(Some("b"), "p.instance.a.web-1"), refused);
        assert_eq!(target(Some("b"), &format!("p.session.a.{sid}")), refused);
        assert_eq!(target(Some("a"), &format!("p.session.{sid}")), refused);
        assert_eq!(target(Some("a"), "p.persist"), refused);
        assert_eq!(target(None, "p.instance.web-\u{fffd}"), refused, "bytes that were not UTF-8");
        // Without tenants, as before.
        assert_eq!(target(None, "p.instance.a.web-1"), Ok(Some("a.web-1".into())));
        assert_eq!(target(None, &format!("p.session.{sid}")), Ok(None));
    }
}
