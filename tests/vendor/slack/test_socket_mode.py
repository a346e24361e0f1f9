"""slack_sdk's SocketModeClient, with each of its transports (builtin, websocket-client,
aiohttp), opens a connection to the simulator with the app-level token, gets an envelope and
acks it; the simulator records the ack with the client's payload. After a refresh, it connects
again and still gets envelopes."""

import asyncio
import threading

import pytest
from slack_sdk import WebClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from conftest import APP_TOKEN, APPROVALS, PERSON, wait_until

COMMAND = {"command": "/sandbox", "text": "list", "user_id": PERSON, "channel_id": APPROVALS,
           "team_id": "T0SIM", "response_url": "http://127.0.0.1:1/hooks/x", "trigger_id": "1.2.3"}


def send_and_wait_for_ack(sim, seen):
    """Sends a slash command envelope; returns the ack the simulator recorded for it."""
    status, sent = sim.post("/_sim/socket/send", {"type": "slash_commands", "payload": COMMAND})
    assert status == 200, sent
    envelope_id = sent["envelope_id"]
    wait_until("the envelope", lambda: envelope_id in seen)
    acked = wait_until("the ack", lambda: [a for a in sim.get("/_sim/socket/acks")
                                             if a["envelope_id"] == envelope_id])
    return envelope_id, acked[0]


def connected(sim):
    return sim.get("/_sim/socket/connections")["open"]


@pytest.mark.parametrize("transport", ["builtin", "websocket_client"])
def test_the_sync_socket_mode_clients_get_envelopes_ack_them_and_reconnect(sim, transport):
    if transport == "builtin":
        from slack_sdk.socket_mode.builtin import SocketModeClient
    else:
        from slack_sdk.socket_mode.websocket_client import SocketModeClient
    web = WebClient(base_url=sim.api_url)
    client = SocketModeClient(app_token=APP_TOKEN, web_client=web)
    seen = {}
    lock = threading.Lock()

    def listener(client, req: SocketModeRequest):
        with lock:
            seen[req.envelope_id] = req.payload
        client.send_socket_mode_response(
            SocketModeResponse(envelope_id=req.envelope_id, payload={"text": "Listing…"}))

    client.socket_mode_request_listeners.append(listener)
    try:
        client.connect()
        wait_until("a connection", lambda: connected(sim))
        envelope_id, ack = send_and_wait_for_ack(sim, seen)
        assert seen[envelope_id]["command"] == "/sandbox"
        assert ack["known"] is True
        assert ack["payload"] == {"text": "Listing…"}
        # Slack refreshes connections: the client opens a new one and goes on.
        opens = sim.get("/_sim/socket/connections")["opens"]
        status, _ = sim.post("/_sim/socket/drop", {"disconnect": True})
        assert status in (200, 204)
        wait_until("a new connection",
                   lambda: sim.get("/_sim/socket/connections")["opens"] > opens and connected(sim))
        envelope_id, ack = send_and_wait_for_ack(sim, seen)
        assert ack["known"] is True
    finally:
        client.close()


def test_the_aiohttp_socket_mode_client_gets_an_envelope_and_acks_it(sim):
    from slack_sdk.socket_mode.aiohttp import SocketModeClient

    seen = {}

    async def run():
        web = AsyncWebClient(base_url=sim.api_url)
        client = SocketModeClient(app_token=APP_TOKEN, web_client=web)

        async def listener(client, req: SocketModeRequest):
            seen[req.envelope_id] = req.payload
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

        client.socket_mode_request_listeners.append(listener)
        await client.connect()
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, wait_until, "a connection", lambda: connected(sim))
            return await loop.run_in_executor(None, send_and_wait_for_ack, sim, seen)
        finally:
            await client.close()

    envelope_id, ack = asyncio.run(run())
    assert seen[envelope_id]["text"] == "list"
    assert ack["known"] is True
    assert "payload" not in ack


def test_apps_connections_open_takes_only_the_app_token(sim):
    opened = WebClient(token=APP_TOKEN, base_url=sim.api_url).apps_connections_open(app_token=APP_TOKEN)
    assert opened["url"].startswith("ws://")
    from slack_sdk.errors import SlackApiError
    with pytest.raises(SlackApiError) as raised:
        WebClient(base_url=sim.api_url).apps_connections_open(app_token="xapp-1-other")
    assert raised.value.response["error"] == "invalid_auth"
