"""slack_sdk's WebClient calls every Web API method Steward uses, and the ones a Slack client
reads back with, against the simulator; Slack's errors come from the simulator's state, never
from a programmed fault."""

import asyncio
import urllib.request

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.models.blocks import ActionsBlock, ButtonElement, SectionBlock
from slack_sdk.models.views import View
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook import WebhookClient

from conftest import APPROVALS, BOT_TOKEN, GROUP, GROUP_MEMBERS, LONELY, PERSON


def refused(call, **kwargs):
    """The response of a call slack_sdk raised SlackApiError for."""
    with pytest.raises(SlackApiError) as raised:
        call(**kwargs)
    return raised.value.response


def card_blocks():
    return [
        SectionBlock(text="*Kill* `sbx1`?", block_id="case:1"),
        ActionsBlock(elements=[ButtonElement(text="Kill", action_id="kill", value="sbx1")]),
    ]


def test_auth_test_answers_the_bot_user_for_a_bot_token_and_the_installer_for_a_user_token(sim, client):
    bot = client.auth_test()
    assert bot["ok"] is True
    assert bot["user_id"] == "U0STEWARD"
    assert bot["bot_id"].startswith("B")
    assert bot["team_id"] == "T0SIM"
    user = WebClient(token="xoxp-installer", base_url=sim.api_url).auth_test()
    assert user["user_id"] == "U0INSTALLER"
    assert "bot_id" not in user


def test_tokens_are_checked_as_slack_checks_them(sim):
    none = refused(WebClient(base_url=sim.api_url).auth_test)
    assert none["error"] == "not_authed"
    garbage = refused(WebClient(token="not-a-token", base_url=sim.api_url).auth_test)
    assert garbage["error"] == "invalid_auth"
    # The simulator pins one bot token: another is a token Slack does not know.
    other_bot = refused(WebClient(token="xoxb-someone-else", base_url=sim.api_url).auth_test)
    assert other_bot["error"] == "invalid_auth"
    app_level = refused(WebClient(token="xapp-1-A0-x", base_url=sim.api_url).chat_postMessage,
                        channel=APPROVALS, text="x")
    assert app_level["error"] == "not_allowed_token_type"
    # A user token posts as the installer, who is in every channel.
    posted = WebClient(token="xoxp-installer", base_url=sim.api_url).chat_postMessage(
        channel=LONELY, text="from a person")
    assert posted["message"]["user"] == "U0INSTALLER"
    assert "bot_id" not in posted["message"]


def test_a_posted_message_comes_back_as_slack_returns_it_with_the_channel_id(client):
    for given in (APPROVALS, "#approvals", "approvals"):
        posted = client.chat_postMessage(channel=given, text="Approval needed", blocks=card_blocks())
        assert posted["channel"] == APPROVALS, given
        message = posted["message"]
        assert message["type"] == "message"
        assert message["ts"] == posted["ts"]
        assert message["user"] == "U0STEWARD"
        assert message["bot_id"] == "B0STEWARD"
        assert message["app_id"]
        assert message["text"] == "Approval needed"
        assert [b["type"] for b in message["blocks"]] == ["section", "actions"]
        assert message["blocks"][0]["block_id"] == "case:1"
        # Slack gives every block an id, made up when none was sent.
        assert message["blocks"][1]["block_id"]
    plain = client.chat_postMessage(channel=APPROVALS, text="just text")["message"]
    assert plain["blocks"][0]["type"] == "rich_text"


def test_posting_where_slack_would_refuse_gets_slacks_errors(sim, client):
    assert refused(client.chat_postMessage, channel="C0NOSUCH", text="x")["error"] == "channel_not_found"
    assert refused(client.chat_postMessage, channel="#nosuch", text="x")["error"] == "channel_not_found"
    assert refused(client.chat_postMessage, channel=LONELY, text="x")["error"] == "not_in_channel"
    assert refused(client.chat_postMessage, channel=APPROVALS, text="")["error"] == "no_text"
    assert refused(client.chat_postMessage, channel=APPROVALS, text="a" * 40_001)["error"] == "msg_too_long"
    assert refused(client.chat_postMessage, channel=APPROVALS, text="reply",
                   thread_ts="1.000001")["error"] == "thread_not_found"
    # Once the bot is invited, the same post goes through.
    status, _ = sim.post(f"/_sim/channels/{LONELY}/invite", {})
    assert status == 204
    assert client.chat_postMessage(channel=LONELY, text="x")["channel"] == LONELY
    posted_messages = [m for m in sim.get("/_sim/messages") if m["method"] == "chat.postMessage"]
    assert len(posted_messages) == 7


def test_a_channel_added_without_the_bot_refuses_posts_until_the_invite(sim, client):
    status, _ = sim.post("/_sim/channels", {"id": "C0NEW", "name": "new", "bot_member": False})
    assert status == 204
    assert client.conversations_info(channel="C0NEW")["channel"]["is_member"] is False
    assert refused(client.chat_postMessage, channel="C0NEW", text="x")["error"] == "not_in_channel"
    sim.post("/_sim/channels/C0NEW/invite", {})
    assert client.conversations_info(channel="C0NEW")["channel"]["is_member"] is True
    assert client.chat_postMessage(channel="#new", text="x")["channel"] == "C0NEW"


def test_chat_update_edits_the_message_and_refuses_what_slack_refuses(client):
    posted = client.chat_postMessage(channel=APPROVALS, text="Waiting", blocks=card_blocks())
    updated = client.chat_update(channel=APPROVALS, ts=posted["ts"], text="Killed", blocks=[])
    assert updated["channel"] == APPROVALS
    assert updated["ts"] == posted["ts"]
    assert updated["message"]["text"] == "Killed"
    assert updated["message"]["edited"]["user"] == "U0STEWARD"
    history = client.conversations_history(channel=APPROVALS)["messages"]
    assert history[0]["text"] == "Killed"
    assert refused(client.chat_update, channel=APPROVALS, ts="1.000001", text="x")["error"] == "message_not_found"
    assert refused(client.chat_update, channel="C0NOSUCH", ts=posted["ts"], text="x")["error"] == "channel_not_found"
    assert refused(client.chat_update, channel=APPROVALS, ts=posted["ts"], text="")["error"] == "no_text"
    assert refused(client.chat_update, channel=APPROVALS, ts=posted["ts"],
                   text="a" * 40_001)["error"] == "msg_too_long"


def test_ephemeral_messages_are_answered_with_their_ts(client):
    sent = client.chat_postEphemeral(channel=APPROVALS, user=PERSON, text="only you")
    assert sent["message_ts"]
    assert refused(client.chat_postEphemeral, channel=LONELY, user=PERSON, text="x")["error"] == "not_in_channel"
    assert refused(client.chat_postEphemeral, channel="C0NOSUCH", user=PERSON, text="x")["error"] == "channel_not_found"
    assert refused(client.chat_postEphemeral, channel=APPROVALS, user=PERSON, text="")["error"] == "no_text"


def test_views_open_answers_the_view_with_its_id(client):
    view = View(type="modal", title="Confirm", blocks=[SectionBlock(text="Sure?")], submit="Yes")
    opened = client.views_open(trigger_id="123.456.abc", view=view)
    assert opened["view"]["id"].startswith("V")
    assert opened["view"]["type"] == "modal"
    assert opened["view"]["title"]["text"] == "Confirm"


def test_usergroup_members_are_the_seeded_ones(client):
    assert client.usergroups_users_list(usergroup=GROUP)["users"] == GROUP_MEMBERS
    assert refused(client.usergroups_users_list, usergroup="S0NOSUCH")["error"] == "no_such_subteam"


def test_files_upload_v2_uploads_and_shares_the_file_in_a_thread(sim, client):
    parent = client.chat_postMessage(channel=APPROVALS, text="run log follows")
    uploaded = client.files_upload_v2(
        channel=APPROVALS, thread_ts=parent["ts"], filename="run.log", title="Run log",
        content="line one\nline two\n", initial_comment="The log",
    )
    file_id = uploaded["file"]["id"]
    assert uploaded["file"]["title"] == "Run log"
    assert sim.get_bytes(f"/_sim/files/{file_id}") == b"line one\nline two\n"
    thread = client.conversations_replies(channel=APPROVALS, ts=parent["ts"])["messages"]
    assert [m["text"] for m in thread] == ["run log follows", "The log"]
    assert thread[1]["files"][0]["id"] == file_id
    # Where the bot may not post, the share is refused as Slack refuses it.
    response = refused(client.files_upload_v2, channel=LONELY, filename="x.txt", content="x")
    assert response["error"] == "not_in_channel"
    response = refused(client.files_upload_v2, channel="C0NOSUCH", filename="x.txt", content="x")
    assert response["error"] == "channel_not_found"


def test_the_upload_steps_can_be_called_one_by_one(sim, client):
    url = client.files_getUploadURLExternal(filename="a.txt", length=3)
    urllib.request.urlopen(urllib.request.Request(url["upload_url"], data=b"abc", method="POST"))
    done = client.files_completeUploadExternal(files=[{"id": url["file_id"], "title": "A"}],
                                               channel_id=APPROVALS)
    assert done["files"][0]["id"] == url["file_id"]
    never_uploaded = client.files_getUploadURLExternal(filename="b.txt", length=3)
    response = refused(client.files_completeUploadExternal,
                       files=[{"id": never_uploaded["file_id"]}], channel_id=APPROVALS)
    assert response["error"] == "file_not_found"


def test_history_replies_and_permalinks_read_back_what_was_posted(client):
    first = client.chat_postMessage(channel=APPROVALS, text="first")
    second = client.chat_postMessage(channel=APPROVALS, text="second")
    reply = client.chat_postMessage(channel=APPROVALS, text="a reply", thread_ts=first["ts"])
    history = client.conversations_history(channel=APPROVALS)
    # Newest first, replies only in their thread.
    assert [m["text"] for m in history["messages"]] == ["second", "first"]
    assert history["messages"][1]["reply_count"] == 1
    assert history["has_more"] is False
    page = client.conversations_history(channel=APPROVALS, limit=1)
    assert [m["text"] for m in page["messages"]] == ["second"]
    assert page["has_more"] is True
    rest = client.conversations_history(channel=APPROVALS, limit=1,
                                        cursor=page["response_metadata"]["next_cursor"])
    assert [m["text"] for m in rest["messages"]] == ["first"]
    thread = client.conversations_replies(channel=APPROVALS, ts=first["ts"])["messages"]
    assert [m["text"] for m in thread] == ["first", "a reply"]
    assert thread[1]["thread_ts"] == first["ts"]
    assert refused(client.conversations_replies, channel=APPROVALS, ts="1.000001")["error"] == "thread_not_found"
    assert refused(client.conversations_history, channel=LONELY)["error"] == "not_in_channel"
    assert refused(client.conversations_history, channel="C0NOSUCH")["error"] == "channel_not_found"
    link = client.chat_getPermalink(channel=APPROVALS, message_ts=second["ts"])
    assert link["channel"] == APPROVALS
    assert f"/archives/{APPROVALS}/p{second['ts'].replace('.', '')}" in link["permalink"]
    in_thread = client.chat_getPermalink(channel=APPROVALS, message_ts=reply["ts"])["permalink"]
    assert f"thread_ts={first['ts']}" in in_thread
    assert refused(client.chat_getPermalink, channel=APPROVALS, message_ts="1.000001")["error"] == "message_not_found"
    assert refused(client.chat_getPermalink, channel="C0NOSUCH", message_ts=second["ts"])["error"] == "channel_not_found"


def test_a_rate_limit_answers_429_with_retry_after(start_sim):
    sim = start_sim("--rate-limit", "chat.postMessage=1/60")
    client = WebClient(token=BOT_TOKEN, base_url=sim.api_url)
    client.chat_postMessage(channel=APPROVALS, text="one")
    with pytest.raises(SlackApiError) as raised:
        client.chat_postMessage(channel=APPROVALS, text="two")
    response = raised.value.response
    assert response.status_code == 429
    assert response["error"] == "ratelimited"
    assert 1 <= int(response.headers["retry-after"]) <= 60
    # The limit is per channel for chat.postMessage, as Slack's is.
    sim.post("/_sim/channels", {"id": "C0OTHER", "name": "other"})
    client.chat_postMessage(channel="C0OTHER", text="elsewhere")


def test_slack_sdks_rate_limit_handler_waits_out_retry_after_and_succeeds(start_sim):
    sim = start_sim("--rate-limit", "chat.postMessage=1/1")
    client = WebClient(token=BOT_TOKEN, base_url=sim.api_url)
    client.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=3))
    for text in ("one", "two"):
        client.chat_postMessage(channel=APPROVALS, text=text)
    calls = [m for m in sim.get("/_sim/messages") if m["method"] == "chat.postMessage"]
    assert len(calls) >= 3, "the second post was refused at least once, then accepted"
    history = client.conversations_history(channel=APPROVALS)["messages"]
    assert [m["text"] for m in history] == ["two", "one"]


def test_response_urls_answer_ok_to_slack_sdks_webhook_client(sim):
    webhook = WebhookClient(f"{sim.base_url}/hooks/vendor-suite")
    sent = webhook.send(text="Done", response_type="ephemeral", replace_original=False)
    assert sent.status_code == 200
    assert sent.body == "ok"
    hooks = [m for m in sim.get("/_sim/messages") if m["method"] == "hooks/vendor-suite"]
    assert hooks[0]["text"] == "Done"
    assert hooks[0]["authorized"] is False


def test_the_async_client_posts_and_reads_back(sim):
    async def run():
        client = AsyncWebClient(token=BOT_TOKEN, base_url=sim.api_url)
        posted = await client.chat_postMessage(channel="#approvals", text="async")
        history = await client.conversations_history(channel=APPROVALS)
        with pytest.raises(SlackApiError) as raised:
            await client.chat_postMessage(channel=LONELY, text="x")
        return posted, history, raised.value.response

    posted, history, refusal = asyncio.run(run())
    assert posted["channel"] == APPROVALS
    assert history["messages"][0]["text"] == "async"
    assert refusal["error"] == "not_in_channel"


def test_an_unknown_method_is_unknown_method(client):
    assert refused(client.api_call, api_method="chat.scheduleMessageLater")["error"] == "unknown_method"
