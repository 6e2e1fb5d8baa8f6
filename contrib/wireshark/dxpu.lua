-- Wireshark dissector for the dxpu link (docs/wire-protocol.md, version 2) and the PCIe
-- TLPs its DATA frames carry (PCIe 6.0 non-flit TLP headers, §2.2).
--
--   tshark -X lua_script:dxpu.lua -r capture.pcapng
--   wireshark -X lua_script:dxpu.lua capture.pcapng   (or copy it to ~/.local/lib/wireshark/plugins/)
--
-- Frames are found on UDP port 7440 and, by their magic and version, on any other port.
-- A session whose CHALLENGE negotiated encryption has its DATA bodies shown as encrypted.
-- TLP fields are typed, so that filters compare numbers: `dxpu.tlp.address > 0x1000`,
-- `dxpu.tlp.tag == 5`, `dxpu.tlp.requester == 0x0100` (01:00.0), `dxpu.tlp.kind == "MRd64"`.
-- A field the TLP's kind does not have is absent (`tshark -T json` keeps each TLP's fields
-- together). A completion links to its request (`dxpu.tlp.request_in`, `dxpu.tlp.time`, the
-- response time) and the request to its first completion (`dxpu.tlp.response_in`); a DATA
-- frame sent again is marked `dxpu.retransmission`, and it and a NAK raise expert info.

local dxpu = Proto("dxpu", "dxpu link")

local FRAME_TYPES = {
    [1] = "INIT", [2] = "CHALLENGE", [3] = "RESPONSE", [4] = "ESTABLISHED", [5] = "DATA",
    [6] = "ACK", [7] = "KEEPALIVE", [8] = "CLOSE", [9] = "COOKIE", [10] = "REFUSE",
}

local f = dxpu.fields
f.magic = ProtoField.uint16("dxpu.magic", "Magic", base.HEX)
f.version = ProtoField.uint8("dxpu.version", "Version")
f.type = ProtoField.uint8("dxpu.type", "Frame type", base.DEC, FRAME_TYPES)
f.type_name = ProtoField.string("dxpu.type_name", "Frame type name")
f.session = ProtoField.uint32("dxpu.session", "Receiver's session ID", base.HEX)
f.epoch = ProtoField.uint32("dxpu.epoch", "Sender's epoch", base.HEX)
f.pn = ProtoField.uint64("dxpu.pn", "Packet number")
f.seq = ProtoField.uint32("dxpu.seq", "Sequence number")
f.ack = ProtoField.uint32("dxpu.ack", "ACK (next sequence number expected)")
f.sack_start = ProtoField.uint32("dxpu.sack.start", "Held from (sequence number)")
f.sack_end = ProtoField.uint32("dxpu.sack.end", "Held up to (exclusive)")
f.flags = ProtoField.uint16("dxpu.flags", "Flags", base.HEX)
f.nak = ProtoField.bool("dxpu.nak", "NAK", 16, nil, 0x0001)
f.fc_present = ProtoField.bool("dxpu.fc_present", "Credit block", 16, nil, 0x0002)
f.key_phase = ProtoField.bool("dxpu.key_phase", "Key phase", 16, nil, 0x0004)
f.body_len = ProtoField.uint16("dxpu.body_len", "Body length")
f.fc_ph = ProtoField.uint32("dxpu.fc.ph", "Posted header credit limit")
f.fc_pd = ProtoField.uint32("dxpu.fc.pd", "Posted data credit limit")
f.fc_nph = ProtoField.uint32("dxpu.fc.nph", "Non-posted header credit limit")
f.fc_npd = ProtoField.uint32("dxpu.fc.npd", "Non-posted data credit limit")
f.fc_cplh = ProtoField.uint32("dxpu.fc.cplh", "Completion header credit limit")
f.fc_cpld = ProtoField.uint32("dxpu.fc.cpld", "Completion data credit limit")
f.body = ProtoField.bytes("dxpu.body", "Body")
f.encrypted = ProtoField.bytes("dxpu.encrypted", "Encrypted body")
f.mac = ProtoField.bytes("dxpu.mac", "MAC tag")
f.crc = ProtoField.uint32("dxpu.crc", "CRC32C", base.HEX)
f.tlp = ProtoField.bytes("dxpu.tlp", "TLP")
f.tlp_record_len = ProtoField.uint16("dxpu.tlp.record_len", "TLP record length")
f.tlp_kind = ProtoField.string("dxpu.tlp.kind", "Kind")
f.tlp_fmt = ProtoField.uint8("dxpu.tlp.fmt", "Fmt")
f.tlp_type = ProtoField.uint8("dxpu.tlp.type", "Type", base.HEX)
f.tlp_tc = ProtoField.uint8("dxpu.tlp.tc", "Traffic class")
f.tlp_length = ProtoField.uint16("dxpu.tlp.length", "Length (DW)")
f.tlp_requester = ProtoField.uint16("dxpu.tlp.requester", "Requester ID", base.HEX)
f.tlp_tag = ProtoField.uint16("dxpu.tlp.tag", "Tag")
f.tlp_address = ProtoField.uint64("dxpu.tlp.address", "Address", base.HEX)
f.tlp_first_be = ProtoField.uint8("dxpu.tlp.first_be", "First DW byte enables", base.HEX)
f.tlp_last_be = ProtoField.uint8("dxpu.tlp.last_be", "Last DW byte enables", base.HEX)
f.tlp_target = ProtoField.uint16("dxpu.tlp.target", "Configuration target", base.HEX)
f.tlp_register = ProtoField.uint16("dxpu.tlp.register", "Register", base.HEX)
f.tlp_completer = ProtoField.uint16("dxpu.tlp.completer", "Completer ID", base.HEX)
f.tlp_status = ProtoField.uint8("dxpu.tlp.status", "Completion status", base.DEC,
    { [0] = "SC", [1] = "UR", [2] = "CRS", [4] = "CA" })
f.tlp_byte_count = ProtoField.uint16("dxpu.tlp.byte_count", "Byte count")
f.tlp_lower_address = ProtoField.uint8("dxpu.tlp.lower_address", "Lower address", base.HEX)
f.tlp_message = ProtoField.uint8("dxpu.tlp.message", "Message code", base.HEX)
f.tlp_data = ProtoField.bytes("dxpu.tlp.data", "Data")
f.tlp_request_in = ProtoField.framenum("dxpu.tlp.request_in", "Request in frame")
f.tlp_response_in = ProtoField.framenum("dxpu.tlp.response_in", "Response in frame")
f.tlp_time = ProtoField.relative_time("dxpu.tlp.time", "Response time")
f.retransmission = ProtoField.bool("dxpu.retransmission", "Retransmission")

local e_bad = ProtoExpert.new("dxpu.bad", "Malformed dxpu frame", expert.group.MALFORMED, expert.severity.ERROR)
local e_nak = ProtoExpert.new("dxpu.nak.expert", "NAK: the receiver asks for the frames from this ACK again",
    expert.group.SEQUENCE, expert.severity.WARN)
local e_retransmission = ProtoExpert.new("dxpu.retransmission.expert", "Retransmission: this DATA frame was sent before",
    expert.group.SEQUENCE, expert.severity.NOTE)
local e_unanswered = ProtoExpert.new("dxpu.tlp.no_response", "Non-posted request with no completion in the capture",
    expert.group.SEQUENCE, expert.severity.NOTE)
dxpu.experts = { e_bad, e_nak, e_retransmission, e_unanswered }

-- Fmt/Type byte → kind name, as the tlp crate names them (tlp::Kind).
local KINDS = {
    [0x00] = "MRd32", [0x20] = "MRd64", [0x01] = "MRdLk32", [0x21] = "MRdLk64",
    [0x40] = "MWr32", [0x60] = "MWr64", [0x02] = "IORd", [0x42] = "IOWr",
    [0x04] = "CfgRd0", [0x05] = "CfgRd1", [0x44] = "CfgWr0", [0x45] = "CfgWr1",
    [0x0a] = "Cpl", [0x4a] = "CplD", [0x0b] = "CplLk", [0x4b] = "CplDLk",
    [0x4c] = "FetchAdd32", [0x6c] = "FetchAdd64", [0x4d] = "Swap32", [0x6d] = "Swap64",
    [0x4e] = "CAS32", [0x6e] = "CAS64",
}
for r = 0, 7 do
    KINDS[0x30 + r] = "Msg"
    KINDS[0x70 + r] = "MsgD"
end

local STATUS = { [0] = "SC", [1] = "UR", [2] = "CRS", [4] = "CA", [3] = "rsvd3", [5] = "rsvd5", [6] = "rsvd6", [7] = "rsvd7" }

-- Sessions that negotiated encryption (both IDs), learned from CHALLENGE frames.
local encrypted_sessions = {}

-- Learned on the first pass, shown on every pass (Wireshark dissects a packet again when it
-- is shown): outstanding non-posted requests by requester ID and tag; for each TLP (frame
-- number and record index) the frame of its request or of its first completion and the
-- response time; DATA frames by direction, session and sequence number; retransmissions.
local outstanding = {}
local request_of = {}
local response_of = {}
local data_seen = {}
local retransmitted = {}

function dxpu.init()
    encrypted_sessions, outstanding, request_of, response_of, data_seen, retransmitted = {}, {}, {}, {}, {}, {}
end

local function bdf(v)
    return string.format("%02x:%02x.%d", bit.rshift(v, 8), bit.band(bit.rshift(v, 3), 0x1f), bit.band(v, 7))
end

-- The arithmetic stays unsigned: bit.band would return a negative number from 2^31 up.
local function hex64(hi, lo)
    return string.format("0x%08x%08x", hi, lo)
end

-- `again`: the frame is a retransmission, its TLPs already matched in the first copy.
local function dissect_tlp(tvb, tree, pinfo, record, again)
    local n = tvb:len()
    local at = 0
    -- TLP prefixes (Fmt 100b): one DW each, skipped.
    while at < n and bit.rshift(tvb(at, 1):uint(), 5) == 4 do
        at = at + 4
    end
    if n - at < 12 then
        tree:add_proto_expert_info(e_bad, "TLP header cut short")
        return
    end
    local b0 = tvb(at, 1):uint()
    local b1 = tvb(at + 1, 1):uint()
    local fmt = bit.rshift(b0, 5)
    local ty = bit.band(b0, 0x1f)
    local four_dw = bit.band(fmt, 1) == 1
    local has_data = bit.band(fmt, 2) == 2
    local len_field = bit.band(tvb(at + 2, 2):uint(), 0x3ff)
    if len_field == 0 then len_field = 1024 end
    local kind = KINDS[b0] or string.format("unknown(0x%02x)", b0)
    local t9 = bit.band(bit.rshift(b1, 7), 1)
    local t8 = bit.band(bit.rshift(b1, 3), 1)
    tree:add(f.tlp_kind, kind)
    tree:add(f.tlp_fmt, tvb(at, 1), fmt)
    tree:add(f.tlp_type, tvb(at, 1), ty)
    tree:add(f.tlp_tc, tvb(at + 1, 1), bit.band(bit.rshift(b1, 4), 7))
    local is_read = (kind == "MRd32" or kind == "MRd64" or kind == "MRdLk32" or kind == "MRdLk64"
        or kind == "IORd" or kind == "CfgRd0" or kind == "CfgRd1")
    if has_data or is_read then
        tree:add(f.tlp_length, tvb(at + 2, 2), len_field)
    end
    -- Non-posted: a completion answers it (reads, I/O and configuration writes, atomics).
    local non_posted = is_read or kind == "IOWr" or kind == "CfgWr0" or kind == "CfgWr1"
        or kind:sub(1, 8) == "FetchAdd" or kind:sub(1, 4) == "Swap" or kind:sub(1, 3) == "CAS"
    local here = pinfo.number .. ":" .. record
    local is_cpl = (kind == "Cpl" or kind == "CplD" or kind == "CplLk" or kind == "CplDLk")
    local requester, tag, address, summary
    if is_cpl then
        local status = bit.rshift(tvb(at + 6, 1):uint(), 5)
        tree:add(f.tlp_completer, tvb(at + 4, 2)):append_text(" (" .. bdf(tvb(at + 4, 2):uint()) .. ")")
        tree:add(f.tlp_status, tvb(at + 6, 1), status)
        tree:add(f.tlp_byte_count, tvb(at + 6, 2), bit.band(tvb(at + 6, 2):uint(), 0xfff))
        local rid = tvb(at + 8, 2):uint()
        requester = bdf(rid)
        tag = t9 * 512 + t8 * 256 + tvb(at + 10, 1):uint()
        tree:add(f.tlp_requester, tvb(at + 8, 2)):append_text(" (" .. requester .. ")")
        tree:add(f.tlp_tag, tvb(at + 10, 1), tag)
        tree:add(f.tlp_lower_address, tvb(at + 11, 1), bit.band(tvb(at + 11, 1):uint(), 0x7f))
        if not pinfo.visited and not again then
            local req = outstanding[rid .. ":" .. tag]
            if req then
                request_of[here] = { frame = req.frame, time = pinfo.abs_ts - req.time }
                if not response_of[req.here] then response_of[req.here] = pinfo.number end
            end
        end
        local req = request_of[here]
        if req then
            tree:add(f.tlp_request_in, req.frame):set_generated()
            tree:add(f.tlp_time, NSTime.new(math.floor(req.time), math.floor((req.time % 1) * 1e9 + 0.5))):set_generated()
        end
        summary = string.format("%s %s tag %d → %s", kind, STATUS[status], tag, requester)
    else
        local rid = tvb(at + 4, 2):uint()
        requester = bdf(rid)
        tag = t9 * 512 + t8 * 256 + tvb(at + 6, 1):uint()
        tree:add(f.tlp_requester, tvb(at + 4, 2)):append_text(" (" .. requester .. ")")
        tree:add(f.tlp_tag, tvb(at + 6, 1), tag)
        if non_posted and not again then
            if not pinfo.visited then
                outstanding[rid .. ":" .. tag] = { frame = pinfo.number, time = pinfo.abs_ts, here = here }
            end
            local resp = response_of[here]
            if resp then
                tree:add(f.tlp_response_in, resp):set_generated()
            elseif pinfo.visited then
                tree:add_proto_expert_info(e_unanswered)
            end
        end
        local be = tvb(at + 7, 1):uint()
        local is_msg = (kind == "Msg" or kind == "MsgD")
        local is_cfg = (kind == "CfgRd0" or kind == "CfgRd1" or kind == "CfgWr0" or kind == "CfgWr1")
        if is_msg then
            tree:add(f.tlp_message, tvb(at + 7, 1), be)
        else
            tree:add(f.tlp_first_be, tvb(at + 7, 1), bit.band(be, 0xf))
            tree:add(f.tlp_last_be, tvb(at + 7, 1), bit.rshift(be, 4))
        end
        if is_cfg then
            local reg = bit.bor(bit.lshift(bit.band(tvb(at + 10, 1):uint(), 0xf), 8), bit.band(tvb(at + 11, 1):uint(), 0xfc))
            tree:add(f.tlp_target, tvb(at + 8, 2)):append_text(" (" .. bdf(tvb(at + 8, 2):uint()) .. ")")
            tree:add(f.tlp_register, tvb(at + 10, 2), reg)
            summary = string.format("%s %s reg 0x%03x tag %d", kind, bdf(tvb(at + 8, 2):uint()), reg, tag)
        elseif is_msg and bit.band(ty, 7) ~= 1 then
            summary = string.format("%s code 0x%02x", kind, be)
        else
            local hi, lo = 0, tvb(at + 8, 4):uint()
            if four_dw then
                if n - at < 16 then
                    tree:add_proto_expert_info(e_bad, "4-DW header cut short")
                    return
                end
                hi, lo = lo, tvb(at + 12, 4):uint()
            end
            -- The low DW's two lowest bits are not address bits (reserved, or PH with TH set).
            lo = lo - lo % 4
            address = hex64(hi, lo)
            tree:add(f.tlp_address, tvb(at + 8, four_dw and 8 or 4), UInt64.new(lo, hi))
            if non_posted then
                summary = string.format("%s %s len %d tag %d", kind, address, len_field, tag)
            else
                summary = string.format("%s %s len %d", kind, address, len_field)
            end
        end
    end
    local hdr = four_dw and 16 or 12
    if has_data and n > at + hdr then
        tree:add(f.tlp_data, tvb(at + hdr, math.min(len_field * 4, n - at - hdr)))
    end
    tree:append_text(": " .. summary)
    return summary
end

local function dissect(tvb, pinfo, root)
    local n = tvb:len()
    if n < 52 or tvb(0, 2):uint() ~= 0x4458 or tvb(2, 1):uint() ~= 2 then
        return 0
    end
    pinfo.cols.protocol = "dxpu"
    local ty = tvb(3, 1):uint()
    local name = FRAME_TYPES[ty] or string.format("UNKNOWN(%d)", ty)
    local tree = root:add(dxpu, tvb(), "dxpu link, " .. name)
    tree:add(f.magic, tvb(0, 2))
    tree:add(f.version, tvb(2, 1))
    tree:add(f.type, tvb(3, 1))
    tree:add(f.type_name, name)
    local session = tvb(4, 4):uint()
    tree:add(f.session, tvb(4, 4))
    tree:add(f.epoch, tvb(8, 4))
    tree:add(f.pn, tvb(12, 8))
    local seq = tvb(20, 4):uint()
    tree:add(f.seq, tvb(20, 4))
    tree:add(f.ack, tvb(24, 4))
    local flags = tvb(28, 2):uint()
    local ft = tree:add(f.flags, tvb(28, 2))
    ft:add(f.nak, tvb(28, 2))
    ft:add(f.fc_present, tvb(28, 2))
    ft:add(f.key_phase, tvb(28, 2))
    local body_len = tvb(30, 2):uint()
    tree:add(f.body_len, tvb(30, 2))
    local at = 32
    if bit.band(flags, 2) == 2 then
        local fc = tree:add(dxpu, tvb(32, 24), "Credit limits")
        fc:add(f.fc_ph, tvb(32, 4)); fc:add(f.fc_pd, tvb(36, 4))
        fc:add(f.fc_nph, tvb(40, 4)); fc:add(f.fc_npd, tvb(44, 4))
        fc:add(f.fc_cplh, tvb(48, 4)); fc:add(f.fc_cpld, tvb(52, 4))
        at = 56
    end
    if at + body_len + 20 > n then
        tree:add_proto_expert_info(e_bad, string.format("body length %d beyond the datagram", body_len))
        return n
    end
    local info = name
    if ty == 5 then
        info = string.format("DATA seq %d", seq)
        if not pinfo.visited then
            local key = tostring(pinfo.src) .. ":" .. pinfo.src_port .. ">" .. tostring(pinfo.dst) .. ":"
                .. pinfo.dst_port .. "/" .. session .. "/" .. seq
            if data_seen[key] and data_seen[key] ~= pinfo.number then
                retransmitted[pinfo.number] = true
            else
                data_seen[key] = pinfo.number
            end
        end
        if retransmitted[pinfo.number] then
            tree:add(f.retransmission, true):set_generated()
            tree:add_proto_expert_info(e_retransmission)
            info = info .. " (retransmission)"
        end
    end
    if bit.band(flags, 1) == 1 then
        info = info .. string.format(" NAK %d", tvb(24, 4):uint())
        tree:add_proto_expert_info(e_nak)
    end
    if (ty == 6 or ty == 7) and body_len > 0 and body_len % 8 == 0 then
        -- ACK, KEEPALIVE: selective acknowledgement, ranges [start, end) held beyond the gap.
        local st = tree:add(dxpu, tvb(at, body_len), "Selective acknowledgement")
        local parts = {}
        for p = at, at + body_len - 8, 8 do
            st:add(f.sack_start, tvb(p, 4))
            st:add(f.sack_end, tvb(p + 4, 4))
            parts[#parts + 1] = string.format("%d..%d", tvb(p, 4):uint(), tvb(p + 4, 4):uint())
        end
        info = info .. " SACK " .. table.concat(parts, ",")
    end
    if ty == 2 and body_len >= 25 then
        -- CHALLENGE: options (negotiated) at body offset 24, bit 1 ENCRYPT.
        if bit.band(tvb(at + 24, 1):uint(), 2) == 2 then
            encrypted_sessions[session] = true
            encrypted_sessions[tvb(at, 4):uint()] = true
        end
    end
    if ty == 5 and body_len > 0 then
        if encrypted_sessions[session] then
            tree:add(f.encrypted, tvb(at, body_len))
            info = info .. " (encrypted)"
        else
            local p = at
            local kinds = {}
            local record = 0
            while p + 2 <= at + body_len do
                local rl = tvb(p, 2):uint()
                if rl == 0 or p + 2 + rl > at + body_len then
                    tree:add_proto_expert_info(e_bad, "TLP record runs past the body")
                    break
                end
                local t = tree:add(f.tlp, tvb(p + 2, rl))
                t:add(f.tlp_record_len, tvb(p, 2))
                local k = dissect_tlp(tvb(p + 2, rl):tvb(), t, pinfo, record, retransmitted[pinfo.number])
                kinds[#kinds + 1] = k or "?"
                record = record + 1
                p = p + 2 + rl
            end
            info = info .. ": " .. table.concat(kinds, ", ")
        end
    elseif body_len > 0 then
        tree:add(f.body, tvb(at, body_len))
    end
    tree:add(f.mac, tvb(n - 20, 16))
    tree:add(f.crc, tvb(n - 4, 4))
    pinfo.cols.info = info
    return n
end

function dxpu.dissector(tvb, pinfo, tree)
    return dissect(tvb, pinfo, tree)
end

local function heuristic(tvb, pinfo, tree)
    if tvb:len() < 52 or tvb(0, 2):uint() ~= 0x4458 or tvb(2, 1):uint() ~= 2 then
        return false
    end
    dissect(tvb, pinfo, tree)
    return true
end

DissectorTable.get("udp.port"):add(7440, dxpu)
dxpu:register_heuristic("udp", heuristic)
