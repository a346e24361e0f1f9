"""slack_sdk's SignatureVerifier accepts what the simulator signs and sends to Steward (slash
commands, clicks, modal submissions), and refuses it under another secret or once changed."""

import urllib.parse

from slack_sdk.models.blocks import ActionsBlock, ButtonElement, SectionBlock
from slack_sdk.models.views import View
from slack_sdk.signature import SignatureVerifier

from conftest import APPROVALS, PERSON, SIGNING_SECRET, wait_until


def check_signed(request):
    body = request["body"]
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert SignatureVerifier(SIGNING_SECRET).is_valid_request(body, headers)
    assert not SignatureVerifier("another-secret").is_valid_request(body, headers)
    assert not SignatureVerifier(SIGNING_SECRET).is_valid_request(body + b"&x=1", headers)
    return urllib.parse.parse_qs(body.decode())


def test_a_slash_command_from_the_page_is_signed_as_slack_signs_it(sim, receiver):
    status, answer = sim.post("/_sim/act/command",
                              {"user": PERSON, "channel": APPROVALS, "text": "/sandbox list"})
    assert status == 200, answer
    [request] = wait_until("the command", lambda: receiver.received("/slack/commands"))
    form = check_signed(request)
    assert form["command"] == ["/sandbox"]
    assert form["text"] == ["list"]
    assert form["channel_id"] == [APPROVALS]
    assert form["user_id"] == [PERSON]


def test_a_click_and_a_modal_submission_are_signed_as_slack_signs_them(sim, client, receiver):
    posted = client.chat_postMessage(channel=APPROVALS, text="Kill?", blocks=[
        SectionBlock(text="Kill `sbx1`?"),
        ActionsBlock(elements=[ButtonElement(text="Kill", action_id="kill", value="sbx1")]),
    ])
    status, answer = sim.post("/_sim/act/click", {"user": PERSON, "channel": APPROVALS,
                                                  "ts": posted["ts"], "block": 1, "element": 0})
    assert status == 200, answer
    [click] = wait_until("the click", lambda: receiver.received("/slack/interactions"))
    assert '"block_actions"' in check_signed(click)["payload"][0]

    view = View(type="modal", title="Reason", callback_id="reason", submit="Send",
                blocks=[SectionBlock(text="Why?")])
    opened = client.views_open(trigger_id="1.2.3", view=view)
    status, answer = sim.post("/_sim/act/submit", {"user": PERSON, "view_id": opened["view"]["id"]})
    assert status == 200, answer
    interactions = wait_until("the submission",
                              lambda: receiver.received("/slack/interactions")[1:])
    assert '"view_submission"' in check_signed(interactions[0])["payload"][0]
